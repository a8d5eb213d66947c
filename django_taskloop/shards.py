"""Tubes spread over several databases (shards): more write capacity than one primary gives.

Name a tube's shards in the settings, each an alias of ``DATABASES`` (migrated like any other)::

    TASKLOOP = {"SHARDS": {"emails": ["default", "queue2", "queue3"]}}

A setting per queue, as ``TASKS`` and ``CACHES`` name their backends, rather than a database
router: a router gives one database per model, and a sharded tube's rows live in several at
once. Each shard holds a whole tube of that name, with its own tasks, counters and consumers;
nothing joins two shards, so each commits on its own server and their capacities add up.

- ``shards.tube("emails").put(data, utube="customer-7")`` puts on one shard: by the ``utube``
  key's hash (so a key's tasks keep their order and run one at a time), else the next shard in
  turn; a shard that cannot be reached is left out of the turn for a while and the put goes to
  the next one (a put pinned by its key waits for its shard: the error is raised).
- ``@tube("emails")`` handlers put through the same door (``emails.put(...)``), and
  ``manage.py workers`` serves each shard of the tube in turn, settling every task on the
  shard it came from; a shard that is down waits (its tasks stay there, held by nobody or by
  leases that run out) while the other shards go on.
- ``statistics()`` adds up the shards' and lists each under ``"shards"``; a shard that cannot
  be reached is left out and named under ``"down"`` with the reason (:func:`read_each`, as the
  operator's views do); ``pause()`` and ``resume()`` act on every shard.

Job boards shard the same way (:func:`board`: ``post`` in turn; ``@board`` workers claim from
every shard). A Django Tasks backend names its shards in ``OPTIONS["DATABASES"]``.

A queue that ``SHARDS`` does not name lives in its one database as before, at no extra cost.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections, router, transaction
from django.db.models import Model

from .conf import setting, tasks_backend_aliases
from .engine.deadline import DeadlinePassed, bounded
from .engine.reach import unreachable
from .exceptions import NotFound, TubeError
from .models import Failure, Job, JobBoard, Task, TaskRecord, Tube
from .models.operating import TASKS_TUBE_PREFIXES
from .task_options import TaskloopTask, task_key
from .validation import check_aliases

__all__ = [
    "PutUncertain",
    "ShardedBoard",
    "ShardedTube",
    "board",
    "board_databases",
    "databases",
    "databases_of",
    "everywhere",
    "homes",
    "is_sharded",
    "open_tube",
    "pick",
    "read_each",
    "registered_options",
    "shown",
    "tube",
    "tube_databases",
    "use_registrations",
]

#: The workers' logger: open_tube's warning is about what a ``@tube`` handler asked for.
logger = logging.getLogger("django_taskloop.workers")


class PutUncertain(DeadlinePassed):
    """A put's shard stopped answering during its ``COMMIT``: it may or may not have been made
    there (it is not made on another shard, which could make it twice)."""


#: Seconds a shard that could not be reached stays out of the puts' turn.
DOWN_FOR = 5.0

T = TypeVar("T")
#: A shard's queue: a tube or a board.
Q = TypeVar("Q", Tube, JobBoard)

_turn = itertools.count()
_down: dict[str, float] = {}
_lock = threading.Lock()


def databases_of(name: str) -> list[str]:
    """Return the database aliases tube ``name`` lives in: its ``SHARDS`` entry, else the one
    database the router gives tubes."""
    shards = setting("SHARDS").get(name)
    if shards:
        return list(shards)
    return [router.db_for_write(Tube)]


def tube_databases() -> list[str]:
    """Every database that may hold tubes: the router's first, then each alias that
    ``SHARDS`` or a Django Tasks backend's ``OPTIONS["DATABASES"]`` names (the read model,
    the metrics and ``reap_locks`` look at each)."""
    found = [router.db_for_read(Tube)]
    for aliases in setting("SHARDS").values():
        found.extend(aliases)
    tasks = getattr(settings, "TASKS", None) or {}
    for alias in tasks_backend_aliases():
        found.extend((tasks[alias].get("OPTIONS") or {}).get("DATABASES") or ())
    return [alias for alias in dict.fromkeys(found) if alias in connections.settings]


def board_databases() -> list[str]:
    """Every database that may hold boards: the router's first, then each alias ``SHARDS``
    names (the read model, the metrics and ``reap_locks`` look at each)."""
    found = [router.db_for_read(JobBoard)]
    for aliases in setting("SHARDS").values():
        found.extend(aliases)
    return [alias for alias in dict.fromkeys(found) if alias in connections.settings]


def databases(model: type[Model]) -> list[str]:
    """Every database that may hold rows of ``model``: a tube's (and a Django Task result's)
    :func:`tube_databases`, a board's (and a job's) :func:`board_databases`, a failure's any of
    them, else the router's."""
    if model in (Tube, TaskRecord):
        return list(dict.fromkeys([router.db_for_write(model), *tube_databases()]))
    if model is JobBoard:
        return list(dict.fromkeys([router.db_for_write(model), *board_databases()]))
    if model is Failure:  # a shard's workers record its failures and throughput on it
        return list(dict.fromkeys([router.db_for_write(model), *tube_databases(), *board_databases()]))
    return [router.db_for_write(model)]


def shown(name: str, using: str) -> str:
    """Name tube ``name`` of database ``using`` for people: ``emails``, or ``emails@queue2`` on a
    database other than the router's."""
    return name if using == router.db_for_read(Tube) else f"{name}@{using}"


def homes(model: type[Tube] | type[JobBoard], name: str) -> list[str]:
    """Return the databases queue ``name`` of ``model`` (:class:`Tube` or :class:`JobBoard`) may
    live in: its ``SHARDS`` entry; a Django Tasks queue's tube: every database that may hold
    tubes (its backend's ``OPTIONS["DATABASES"]`` among them); else the router's."""
    named = setting("SHARDS").get(name)
    if named:
        return list(named)
    if model is Tube and name.startswith(TASKS_TUBE_PREFIXES):
        return tube_databases()
    return [router.db_for_read(model)]


def everywhere(model: type[Q], name: str) -> list[Q]:
    """Return queue ``name`` of ``model`` on each database that holds it (see :func:`homes`), in
    that order: what the operator's verbs (pause, resume, retry) act on, so that they act on
    the whole queue. ``name@alias``, as :func:`shown` writes one shard's, names that one only."""
    base, at, alias = name.rpartition("@")
    if at and base and alias in tube_databases():
        return [found for found in [model.objects.using(alias).filter(name=base).first()] if found]
    return [
        found
        for alias in homes(model, name)
        if (found := model.objects.using(alias).filter(name=name).first()) is not None
    ]


def is_sharded(name: str) -> bool:
    """Say whether ``SHARDS`` names tube ``name`` (one database, or several)."""
    return bool(setting("SHARDS").get(name))


def read_each(aliases: Iterable[str], read: Callable[[str], T], down: dict[str, str]) -> dict[str, T]:
    """Return ``{alias: read(alias)}`` for each database of ``aliases`` that can be reached.

    The one place where a read of the queues turns a database that is down into a mark: when
    ``read`` fails and a fresh connection to that database fails too (refused at once when
    its server is down), the database is left out and named in ``down`` with the one-line
    reason; one already in ``down`` is not tried again, so that one look (a page, a status, a
    scrape, a reap) pays for a down database once. Each read has ``DATABASE_TIMEOUT`` to
    answer (outside a caller's transaction): a server that hangs is down too. Any other error
    is raised.
    """
    found: dict[str, T] = {}
    for alias in aliases:
        if alias in down:
            continue
        try:
            if connections[alias].in_atomic_block:  # a caller's transaction (ATOMIC_REQUESTS): its own
                found[alias] = read(alias)
            else:
                with bounded(alias):
                    found[alias] = read(alias)
        except DatabaseError as raised:
            # A server that hangs did not answer within DATABASE_TIMEOUT: down, as one refused.
            error = raised if isinstance(raised, DeadlinePassed) else unreachable(alias)
            if error is None:
                raise
            text = str(error).strip()
            down[alias] = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    return found


def _key_hash(key: Any) -> int:
    # crc32 of the key's text: the same shard for a key in every process and every run (the
    # built-in hash() of a str differs from process to process).
    return zlib.crc32(str(key).encode())


def pick(databases: Sequence[str], key: Any = None) -> str:
    """Return the shard of ``databases`` a put goes to: the key's, or the next in turn among
    those not found down in the last :data:`DOWN_FOR` seconds (all of them if every one was)."""
    if key is not None:
        return databases[_key_hash(key) % len(databases)]
    now = time.monotonic()
    with _lock:
        up = [alias for alias in databases if _down.get(alias, 0.0) <= now] or list(databases)
    return up[next(_turn) % len(up)]


def mark_down(alias: str) -> None:
    """Leave shard ``alias`` out of the puts' turn for :data:`DOWN_FOR` seconds."""
    with _lock:
        _down[alias] = time.monotonic() + DOWN_FOR


class _Sharded(Generic[Q]):
    """A queue over its shards: the shard a write goes to, and the verbs that act on all."""

    kind = "queue"

    def __init__(self, name: str, databases: Sequence[str], create: dict[str, Any] | None = None) -> None:
        self.name = name
        self.databases = list(databases)
        self.create = dict(create or {})
        self._queues: dict[str, Q] = {}  # each shard's tube or board, once opened

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} over {', '.join(self.databases)}>"

    def _open(self, alias: str) -> Q:
        raise NotImplementedError

    def shard(self, alias: str) -> Q:
        """Return the queue of shard ``alias`` (made there, with the options given, if need be)."""
        if alias not in self.databases:
            raise ValueError(
                f"{alias!r} is not a shard of {self.kind} {self.name!r}: {', '.join(self.databases)}"
            )
        found = self._queues.get(alias)
        if found is None:
            found = self._queues[alias] = self._open(alias)
        return found

    def pause(self) -> None:
        """Pause the queue on every shard."""
        for alias in self.databases:
            self.shard(alias).pause()

    def resume(self) -> None:
        """Resume the queue on every shard."""
        for alias in self.databases:
            self.shard(alias).resume()

    @property
    def paused(self) -> bool:
        """Whether the queue is paused on every shard."""
        return all(self.shard(alias).paused for alias in self.databases)

    def _on_some_shard(self, key: Any, verb: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``verb`` on the tube of the shard a put goes to; a shard that cannot be reached
        (or does not answer within ``SHARD_PUT_TIMEOUT``) is marked down and, unless ``key``
        pins the put to it, the next shard is tried. A put pinned by its key waits at most
        ``DATABASE_TIMEOUT`` for its shard, then raises."""
        tried: list[str] = []
        while True:
            alias = pick([a for a in self.databases if a not in tried] or self.databases, key)
            try:
                return self._put_on(alias, key is None and len(self.databases) > 1, verb, *args, **kwargs)
            except DatabaseError as error:
                hung = isinstance(error, DeadlinePassed)
                if (
                    key is not None
                    or isinstance(error, PutUncertain)
                    or (not hung and unreachable(alias) is None)
                ):
                    raise
                mark_down(alias)
                tried.append(alias)
                if len(tried) == len(self.databases):
                    raise

    def _put_on(self, alias: str, may_move: bool, verb: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``verb`` on shard ``alias``'s queue within a bounded time. A put that may move to
        another shard (``may_move``) runs in a transaction of its own and waits at most
        ``SHARD_PUT_TIMEOUT``: cut off before its ``COMMIT`` was sent, it cannot have been made
        (the server rolls an unfinished transaction back when the connection ends), so it is
        safe to make on the next shard; cut off during its ``COMMIT``, it raises
        :class:`PutUncertain` instead. Inside a caller's transaction on ``alias`` it is the
        caller's: not bounded."""
        if connections[alias].in_atomic_block:
            return self._call(alias, verb, *args, **kwargs)
        if not may_move:
            with bounded(alias):
                return self._call(alias, verb, *args, **kwargs)
        committing = False
        try:
            with bounded(alias, float(setting("SHARD_PUT_TIMEOUT"))), transaction.atomic(using=alias):
                done = self._call(alias, verb, *args, **kwargs)
                committing = True
            return done
        except DeadlinePassed as error:
            if committing:
                raise PutUncertain(
                    f"{self.kind} {self.name!r}: shard {alias!r} did not answer the COMMIT of a "
                    f"{verb} in time: it may or may not have been made there ({error})"
                ) from error
            raise

    def _call(self, alias: str, verb: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.shard(alias), verb)(*args, **kwargs)
        except NotFound:  # dropped since: made again, once
            self._queues.pop(alias, None)
            return getattr(self.shard(alias), verb)(*args, **kwargs)


class ShardedTube(_Sharded[Tube]):
    """A tube over its shards (:func:`tube`): put, put_many, statistics, pause and resume. The
    consumer verbs belong to each shard's :class:`~django_taskloop.models.Tube`
    (:meth:`shard`), as the tasks they name do."""

    kind = "tube"

    def _open(self, alias: str) -> Tube:
        return open_tube(self.name, self.create, using=alias)

    def put(self, data: Any, **options: Any) -> Task:
        """Put a task on one shard (``Tube.put``'s options): the ``utube`` key's, else the next
        in turn. Returns the task; ``task._state.db`` names its shard."""
        task: Task = self._on_some_shard(options.get("utube"), "put", data, **options)
        return task

    def put_many(self, items: Iterable[Any], **options: Any) -> list[Task]:
        """Put one task per item (``Tube.put_many``): all on the ``utube`` key's shard, else
        spread over the shards in turn, one ``put_many`` per shard. Returns the tasks."""
        items = list(items)
        key = options.get("utube")
        if key is not None or len(self.databases) == 1:
            tasks: list[Task] = self._on_some_shard(key, "put_many", items, **options)
            return tasks
        parts = len(self.databases)
        put: list[Task] = []
        for part in range(parts):
            chunk = items[part::parts]
            if chunk:
                put.extend(self._on_some_shard(None, "put_many", chunk, **options) or ())
        return put

    def statistics(self, **options: Any) -> dict[str, Any]:
        """Return ``Tube.statistics()`` added up over the shards that can be reached, with each
        one's own under ``"shards"`` (by alias), and under ``"down"`` ``{alias: reason}`` of
        each shard that cannot (left out of the sums; ``{}`` when none)."""
        down: dict[str, str] = {}
        per_shard = read_each(self.databases, lambda alias: self.shard(alias).statistics(**options), down)
        total: dict[str, Any] = {}
        for stats in per_shard.values():
            for group, counts in stats.items():
                into = total.setdefault(group, {})
                for name, n in counts.items():
                    into[name] = into.get(name, 0) + n
        return {**total, "shards": per_shard, "down": down}


class ShardedBoard(_Sharded[JobBoard]):
    """A job board over its shards (:func:`board`): post, job_count, iterjobs, pause and
    resume. Claims, consumes and the rest belong to each shard's
    :class:`~django_taskloop.models.JobBoard` (:meth:`shard`), as the jobs they name do."""

    kind = "board"

    def _open(self, alias: str) -> JobBoard:
        return JobBoard.objects.db_manager(alias).create_board(self.name, if_not_exists=True)

    def post(self, name: str, details: dict[str, Any] | None = None, **options: Any) -> Job:
        """Post a job (``JobBoard.post``) on one shard, the next in turn (one found down is left
        out); ``job._state.db`` names it."""
        job: Job = self._on_some_shard(None, "post", name, details, **options)
        return job

    @property
    def job_count(self) -> int:
        """The jobs of every shard (``JobBoard.job_count``)."""
        return sum(self.shard(alias).job_count for alias in self.databases)

    def iterjobs(self, only_unclaimed: bool = False) -> Iterator[Job]:
        """Every shard's jobs, shard after shard (``JobBoard.iterjobs``)."""
        for alias in self.databases:
            yield from self.shard(alias).iterjobs(only_unclaimed=only_unclaimed)


def board(name: str) -> ShardedBoard:
    """Return job board ``name`` over the databases ``SHARDS`` names for it (its one database
    if none)."""
    return ShardedBoard(name, databases_of(name))


def tube(name: str, **create: Any) -> ShardedTube:
    """Return tube ``name`` over the databases ``SHARDS`` names for it (its one database if
    none), made where it does not exist yet with the options its registration gives (an
    ``@tube`` handler's), else with ``create`` (``create_tube``'s; default ``type="fifottl"``).

    Options that contradict the registration raise ``ValueError``: a tube is made one way,
    whoever makes it first (a put, ``statistics()``, a worker).
    """
    registered = registered_options(name)
    if registered is None:
        return ShardedTube(name, databases_of(name), create or {"type": "fifottl"})
    differ = {key: value for key, value in create.items() if registered.get(key) != value}
    if differ:
        raise ValueError(
            f"tube {name!r} is registered with "
            f"{', '.join(f'{key}={value!r}' for key, value in registered.items())} (@tube); "
            f"tube() was given {', '.join(f'{key}={value!r}' for key, value in differ.items())}: "
            "leave the options to the registration"
        )
    return ShardedTube(name, databases_of(name), registered)


#: Looks up the options a tube is registered with (see :func:`registered_options`); the worker
#: registry's, set by ``AppConfig.ready()`` (this module imports no worker: a floor above).
_registrations: Callable[[str], dict[str, Any] | None] | None = None


def use_registrations(lookup: Callable[[str], dict[str, Any] | None]) -> None:
    """Make :func:`registered_options` ask ``lookup`` (``AppConfig.ready()`` gives the worker
    registry's :func:`~django_taskloop.workers.registered_options`)."""
    global _registrations
    _registrations = lookup


def registered_options(name: str) -> dict[str, Any] | None:
    """Return the ``create_tube`` options that tube ``name`` is registered with in code (an
    ``@tube`` handler's), or ``None`` if nothing registers it."""
    return None if _registrations is None else _registrations(name)


def open_tube(name: str, options: dict[str, Any], using: str | None = None) -> Tube:
    """Return tube ``name`` (on database ``using``; default: the router's), made with
    ``options`` (``create_tube``'s) if it does not exist.

    A tube that exists with other options stays as it is, with a warning that names both (the
    tasks in it were put under its options): ``create_tube`` warns of other ttl/ttr/pri, and
    another type, which it refuses, is warned of here.
    """
    tubes = Tube.objects.db_manager(using) if using is not None else Tube.objects
    try:
        return tubes.create_tube(name, if_not_exists=True, **options)
    except TubeError:
        existing = tubes.filter(name=name).first()
        if existing is None:
            raise
    differ = {key: value for key, value in options.items() if getattr(existing, key) != value}
    logger.warning(
        "tube %r exists with %s; @tube asked for %s: the stored tube stays (drop and re-create "
        "it, or change the code to match)",
        name,
        ", ".join(f"{key} {getattr(existing, key)!r}" for key in differ),
        ", ".join(f"{key}={value!r}" for key, value in differ.items()),
    )
    return existing


# A Django Tasks backend's queues over its OPTIONS["DATABASES"] (django_taskloop.backends). ------


def backend_databases(given: Any) -> list[str] | None:
    """Return a backend's ``OPTIONS["DATABASES"]`` checked (aliases of ``DATABASES``, none twice),
    or ``None`` when not given (one database: the router's). Raises ``TypeError``/``ValueError``
    (the backend's system check ``taskloop.E004`` says which)."""
    return None if given is None else check_aliases(given, 'OPTIONS["DATABASES"]')


def shard_for(databases: list[str] | None, model: type[Model], key: Any) -> tuple[str, str]:
    """Return the database an enqueue writes to and the mark its result id carries: ``"@<n>"``,
    the shard's place in ``databases`` (append shards, never reorder them: ids name places);
    ``""`` unsharded (the router's database for ``model``)."""
    if databases is None:
        return router.db_for_write(model), ""
    alias = pick(databases, key)
    return alias, f"@{databases.index(alias)}"


def database_of(databases: list[str] | None, model: type[Model], result_id: object) -> str:
    """Return the database that holds ``result_id`` (its ``"@<n>"`` mark names the shard)."""
    _, mark, place = str(result_id).rpartition("@")
    if databases is not None and mark and place.isdigit() and int(place) < len(databases):
        return databases[int(place)]
    return router.db_for_read(model) if databases is None else databases[0]


def in_transaction(using: str, model: type[Model]) -> bool:
    """Say whether the caller is inside a transaction: on ``using``, or (a shard) on the
    database the router gives ``model``, where the caller's own writes go."""
    return connections[using].in_atomic_block or connections[router.db_for_write(model)].in_atomic_block


def call_key(task: Any, call: dict[str, Any]) -> str | None:
    """What pins a Django Task's call to one shard: its ``key``, or a ``unique`` task's call
    itself (its waiting twin must be on the same shard); ``None``: any shard."""
    if not isinstance(task, TaskloopTask):
        return None
    key = task_key(task, call["args"], call["kwargs"])
    if key is not None:
        return key
    if task.unique:
        return json.dumps([call["task"], call["args"], call["kwargs"]], sort_keys=True)
    return None
