"""Handlers that ``manage.py workers`` runs: ``@loop``, ``@tube`` and ``@board`` (and
``@periodic`` functions, see :mod:`django_taskloop.cron`).

Register handlers in an installed app's ``taskloop.py`` (found like ``admin.py``)::

    from django_taskloop.workers import board, loop, tube

    @loop(SiteLoop, batch=100, lock_for=600)
    def crawl(site_id):
        ...

    @tube("emails")
    def send(task):          # a django_taskloop.models.Task; the payload is task.data
        ...

    @board("builds")
    def build(job):          # a django_taskloop.models.Job
        ...

Web code puts into a handler's tube from any process with ``send.put(data)`` (and
``put_many``, ``aput``, ``aput_many``): the first put makes the tube with the decorator's
options if no worker has yet.

A handler that returns normally has done its work (the loop id is marked done, the tube task
acknowledged, the job consumed). A handler that raises is retried later with a growing delay;
tube tasks are buried and jobs trashed after ``TASKLOOP["MAX_ATTEMPTS"]`` attempts.
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from ..compat import explain_refused_options
from ..conf import setting
from ..cron import periodic
from ..exceptions import NotFound
from ..models import TaskLoop, Tube
from ..runtime import FailedForGood, StopNow, run_interruptibly
from ..runtime import backoff as backoff  # re-exported: drivers and the runner import them here
from ..runtime import event_loop as event_loop
from ..runtime import inside_user_code as inside_user_code
from ..shards import ShardedTube, databases_of, is_sharded
from ..shards import open_tube as opened
from ..validation import (
    Rate,
    check_count,
    check_handler,
    check_key_limit,
    check_key_rate,
    check_name,
    check_rate,
    check_seconds,
)

logger = logging.getLogger("django_taskloop.workers")

__all__ = [
    "Handler",
    "open_tube",
    "registered_options",
    "shard_handlers",
    "loop",
    "tube",
    "board",
    "periodic",
    "autodiscover",
    "registry",
    "get_handlers",
    "serving",
    "StopNow",
    "FailedForGood",
    "run_interruptibly",
    "add_handler_source",
]


@dataclass
class Handler:
    """One registered handler: what it serves (``kind`` and ``target``) and how."""

    #: ``"loop"``, ``"tube"`` or ``"board"``.
    kind: str
    #: The name ``--only`` selects it by (the tube's/board's name, the loop's model label).
    name: str
    func: Callable[[Any], Any]
    #: The loop's model class, or the tube's/board's name.
    target: Any
    #: Most items claimed at once.
    batch: int = 100
    #: Seconds of work a worker claims at once: it sizes each claim from the handler's measured
    #: time per item (at least one, at most ``batch``), so that fast handlers run in batches and
    #: slow ones are not hoarded while other workers idle. ``None``: ``TASKLOOP["BATCH_TIME"]``;
    #: ``0``: always claim ``batch``.
    batch_time: float | None = None
    #: How many of its items one worker process runs at once (each in a slot of its own:
    #: see :mod:`.slots`); ``None``: ``workers --concurrency`` (else
    #: ``TASKLOOP["CONCURRENCY"]``, 1).
    concurrency: int | None = None
    #: Tubes: at most this many of its tasks taken at once by every worker together, set on the
    #: tube (``Tube.set_limit``) when a worker starts; ``None``: no limit (a limit set before
    #: is lifted). Built-in handlers leave the tube's as it is, but a Django Tasks queue's
    #: (its backend's ``OPTIONS["LIMITS"]``).
    limit: int | None = None
    #: Tubes: at most this many of its tasks started per period by every worker together
    #: (``Tube.set_rate``), set on the tube when a worker starts; ``None``: no rate.
    rate: Rate | None = None
    #: utube tubes: at most this many tasks of one key taken at once by every worker together
    #: (``Tube.set_key_limit``), set on the tube when a worker starts; ``None``: one at a time.
    key_limit: int | None = None
    #: utube tubes: at most this many tasks of one key started per period by every worker
    #: together (``Tube.set_key_rate``), set on the tube when a worker starts; ``None``: none.
    key_rate: Rate | None = None
    #: Lease taken on each item: the loop's ``lock_for``, the job claim's expiry, the tube's
    #: ttr (which the heartbeat keeps from running out).
    lease: float = 600.0
    #: Loops only: seconds before a done id comes round again (doloop's ``min_loop_time``).
    min_loop_time: float = 3600.0
    #: Keyword arguments for ``create_tube``/``create_board`` when the worker creates it (a tube's
    #: running limit aside: :meth:`tube_options` adds it, see :attr:`running_limit`).
    create: dict[str, Any] = field(default_factory=dict)
    #: Whether the handler is internal (the Django Tasks backend's queues).
    builtin: bool = False
    #: The Django Tasks queue it serves (its plain or its keyed tasks): ``--only`` selects
    #: every handler of a queue by the queue's Django name.
    queue: str | None = None
    #: Tubes: the database this handler serves, one shard of a tube that ``SHARDS`` spreads
    #: over several (the worker makes one handler per shard); ``None``: the router's.
    database: str | None = None
    #: Tubes: the databases the tube is spread over when set here (a Django Tasks backend's
    #: ``OPTIONS["DATABASES"]``) rather than in ``TASKLOOP["SHARDS"]``.
    shards: tuple[str, ...] = ()
    #: Tubes: the tube by database alias, once :meth:`get_tube` has opened it.
    _tubes: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def title(self) -> str:
        """Name what it serves for people: its name, or a Django Tasks queue's Django name,
        ``default (Django Tasks)`` (shared by the queue's plain and keyed handlers)."""
        return f"{self.queue} (Django Tasks)" if self.queue is not None else self.name

    @property
    def described(self) -> str:
        """Name what it serves in a sentence: ``tube emails``, ``Django Tasks queue default``."""
        return f"Django Tasks queue {self.queue}" if self.queue is not None else f"{self.kind} {self.name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The decorated name stays callable as the plain function.
        return self.func(*args, **kwargs)

    @property
    def running_limit(self) -> int | None:
        """The tube's running limit this handler asks for: ``TASKLOOP["LIMITS"]``'s entry for
        its name when there is one (``None`` there: no limit), else the decorator's ``limit``."""
        limits = setting("LIMITS")
        return limits[self.name] if self.name in limits else self.limit

    @property
    def start_rate(self) -> Rate | None:
        """The tube's rate this handler asks for: ``TASKLOOP["RATES"]``'s entry for its name
        when there is one (``None`` there: no rate), else the decorator's ``rate``."""
        rates = setting("RATES")
        return check_rate(rates[self.name], "rate") if self.name in rates else self.rate

    @property
    def per_key_limit(self) -> int | None:
        """The tube's key limit this handler asks for: ``TASKLOOP["KEY_LIMITS"]``'s entry for
        its name when there is one (``None`` there: one at a time), else the decorator's
        ``key_limit``; 1 reads ``None``."""
        limits = setting("KEY_LIMITS")
        limit = limits[self.name] if self.name in limits else self.key_limit
        return None if limit == 1 else limit

    @property
    def per_key_rate(self) -> Rate | None:
        """The tube's key rate this handler asks for: ``TASKLOOP["KEY_RATES"]``'s entry for
        its name when there is one (``None`` there: none), else the decorator's ``key_rate``."""
        rates = setting("KEY_RATES")
        return check_rate(rates[self.name], "key_rate") if self.name in rates else self.key_rate

    def tube_options(self) -> dict[str, Any]:
        """``create_tube``'s options for this ``@tube`` handler's tube: the decorator's, with the
        running limit :attr:`running_limit`, the rate :attr:`start_rate` and the key limit
        :attr:`per_key_limit` say."""
        options = dict(self.create)
        keyed = str(options.get("type")).startswith("utube")
        for option, value in (
            ("limit", self.running_limit),
            ("rate", self.start_rate),
            # (A tube without keys has none: the worker's start says so.)
            ("key_limit", self.per_key_limit if keyed else None),
            ("key_rate", self.per_key_rate if keyed else None),
        ):
            if value is not None:
                options[option] = value
        return options

    # Putting from any process (a view, a script): @tube handlers only. -----------------------

    def get_tube(self) -> Any:
        """Return the tube this ``@tube`` handler serves, made with the decorator's options if
        it does not exist yet (:func:`open_tube`); kept for the next call."""
        if self.kind != "tube":
            raise TypeError(
                f"put() is for @tube handlers; {self.kind} {self.name!r} is not one "
                "(a board's jobs are posted with JobBoard.post, a loop's ids added with add)"
            )

        if self.database is None and is_sharded(self.target):
            sharded = self._tubes.get("*")
            if sharded is None:
                sharded = self._tubes["*"] = ShardedTube(
                    self.target, databases_of(self.target), self.tube_options()
                )
            return sharded
        using = self.database or str(Tube.objects.db)
        tube = self._tubes.get(using)
        if tube is None:
            tube = self._tubes[using] = open_tube(self.target, self.tube_options(), using=using)
        return tube

    def _with_tube(self, verb: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``verb`` on the tube; a tube dropped since is made again, once."""
        try:
            return getattr(self.get_tube(), verb)(*args, **kwargs)
        except NotFound:
            self._tubes.clear()
            return getattr(self.get_tube(), verb)(*args, **kwargs)

    def put(self, data: Any, **options: Any) -> Any:
        """Put a task for this handler: ``tube.put(data, pri=, ttl=, ttr=, delay=, utube=,
        run_at=)`` on its tube, which the first put makes if no worker has yet."""
        return self._with_tube("put", data, **options)

    def put_many(self, items: Iterable[Any], **options: Any) -> Any:
        """Put one task per item for this handler (``tube.put_many``)."""
        return self._with_tube("put_many", list(items), **options)

    async def aput(self, data: Any, **options: Any) -> Any:
        """:meth:`put` from async code."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.put, thread_sensitive=True)(data, **options)

    async def aput_many(self, items: Iterable[Any], **options: Any) -> Any:
        """:meth:`put_many` from async code."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.put_many, thread_sensitive=True)(list(items), **options)


#: Every handler registered so far, by name.
registry: dict[str, Handler] = {}

#: Callables that return built-in handlers (the Tasks backend's queues, the schedules' tube),
#: added by :meth:`TaskloopConfig.ready <django_taskloop.apps.TaskloopConfig.ready>`: the
#: registry imports none of its plug-ins.
handler_sources: list[Callable[[], Iterable[Handler]]] = []


def add_handler_source(source: Callable[[], Iterable[Handler]]) -> None:
    """Make :func:`get_handlers` add the handlers ``source()`` returns (once per source)."""
    if source not in handler_sources:
        handler_sources.append(source)


def _register(handler: Handler) -> Handler:
    check_handler(handler.func)
    existing = registry.get(handler.name)
    if existing is not None and existing.func is not handler.func:
        ref = f"{existing.func.__module__}.{existing.func.__qualname__}"
        raise ValueError(f"a handler named {handler.name!r} is already registered ({ref})")
    registry[handler.name] = handler
    return handler


#: Whether :func:`registered_options` has imported every app's ``taskloop`` module yet.
_discovered = False


def registered_options(name: str) -> dict[str, Any] | None:
    """Return the ``create_tube`` options of tube ``name``'s handler: an ``@tube`` handler's
    (every app's ``taskloop`` module imported first, once per process, if none is known: a web
    process may never have imported it), else a built-in one's; ``None`` if no handler serves it.
    What :func:`django_taskloop.shards.tube` makes a tube with."""
    global _discovered
    handler = registry.get(name)
    if handler is None and not _discovered:
        autodiscover()
        _discovered = True
        handler = registry.get(name)
    if handler is None:
        handler = next(
            (found for source in handler_sources for found in source() if found.name == name), None
        )
    return handler.tube_options() if handler is not None and handler.kind == "tube" else None


def open_tube(name: str, options: dict[str, Any], using: str | None = None) -> Any:
    """Return tube ``name``, made with ``options`` if it does not exist (see
    :func:`django_taskloop.shards.open_tube`)."""
    return opened(name, options, using)


def shard_handlers(handlers: Iterable[Handler]) -> list[Handler]:
    """Return ``handlers`` with each tube handler of a tube that ``SHARDS`` names (or whose
    :attr:`Handler.shards` lists databases) made one handler per shard (:attr:`Handler.database`)."""
    out: list[Handler] = []
    for handler in handlers:
        databases = handler.shards or (databases_of(handler.target) if is_sharded(handler.target) else ())
        if handler.kind not in ("tube", "board") or handler.database is not None or not databases:
            out.append(handler)
            continue
        # Each process starts its rounds at another shard: two processes then claim from
        # different databases at once rather than from the same one in step.
        start = os.getpid() % len(databases)
        turn = [*databases[start:], *databases[:start]]
        out.extend(replace(handler, database=alias, _tubes={}) for alias in turn)
    return out


def loop(
    model: Any,
    *,
    batch: int = 100,
    lock_for: float = 600,
    min_loop_time: float = 3600,
    name: str | None = None,
    batch_time: float | None = None,
    concurrency: int | None = None,
) -> Callable[[Callable[[Any], Any]], Handler]:
    """Register the decorated function to be called with each id claimed from ``model``'s loop.

    Ids are claimed up to ``batch`` at a time (as many as fit ``batch_time`` seconds of the
    handler's measured time, see :class:`Handler`) and locked for ``lock_for`` seconds (renewed
    while the handler runs); each id the handler returns from is marked done.
    """

    if not (isinstance(model, type) and issubclass(model, TaskLoop) and not model._meta.abstract):
        raise TypeError(f"model must be a concrete TaskLoop subclass, not {model!r}")
    batch = check_count(batch, "batch", minimum=1)
    lock_for = check_seconds(lock_for, "lock_for", positive=True)
    min_loop_time = check_seconds(min_loop_time, "min_loop_time", non_negative=True)
    label = check_name(name, "name") if name is not None else model._meta.label_lower
    batch_time = check_seconds(batch_time, "batch_time", allow_none=True, non_negative=True)
    concurrency = _check_concurrency(concurrency)

    def decorate(func: Callable[[Any], Any]) -> Handler:
        return _register(
            Handler(
                "loop",
                label,
                func,
                model,
                batch=batch,
                batch_time=batch_time,
                concurrency=concurrency,
                lease=lock_for,
                min_loop_time=min_loop_time,
            )
        )

    return decorate


def _tube_create(type: str, ttl: Any, ttr: Any, pri: Any) -> dict[str, Any]:  # noqa: A002
    """``create_tube``'s options of an ``@tube`` handler, checked (``type`` and those given)."""
    if type not in ("fifo", "fifottl", "utube", "utubettl"):
        raise ValueError(f"type must be 'fifo', 'fifottl', 'utube' or 'utubettl', not {type!r}")
    ttl = check_seconds(ttl, "ttl", allow_none=True, positive=True)
    ttr = check_seconds(ttr, "ttr", allow_none=True, positive=True)
    if pri is not None and (isinstance(pri, bool) or not isinstance(pri, int)):
        raise TypeError(f"pri must be an int or None, not {builtins.type(pri).__name__}")
    given = {"ttl": ttl, "ttr": ttr, "pri": pri}
    return {"type": type, **{key: value for key, value in given.items() if value is not None}}


def tube(
    name: str,
    *,
    batch: int = 100,
    type: str = "fifottl",  # noqa: A002  (the spelling of create_tube's argument)
    ttl: float | None = None,
    ttr: float | None = None,
    pri: int | None = None,
    batch_time: float | None = None,
    concurrency: int | None = None,
    limit: int | None = None,
    rate: Any = None,
    key_limit: int | None = None,
    key_rate: Any = None,
) -> Callable[[Callable[[Any], Any]], Handler]:
    """Register the decorated function to be called with each task taken from tube ``name``.

    The tube is created with ``type``, ``ttl``, ``ttr`` and ``pri`` (``create_tube``'s
    options) when the worker starts if it does not exist; if it exists with other options,
    the worker logs a warning naming both. The default type, ``fifottl``, is the one whose
    ``release(delay=…)`` lets a failed task wait before its retry. While the handler runs, the
    worker touches the task so that its ttr does not run out (ttl types) and beats as the
    task's consumer.

    ``limit``: at most that many of the tube's tasks run at once, by every worker process on
    every host together (the database counts them: ``Tube.set_limit``). A worker sets it on
    the tube when it starts; without ``limit`` it lifts one set before.

    ``rate``: at most that many of the tube's tasks started per period, by every worker
    together: ``"100/m"``, ``"60/s"``, ``"10/5s"`` or a ``(count, seconds)`` pair
    (``Tube.set_rate``); set on the tube as ``limit`` is. A worker claims a rate-limited tube's
    tasks only for its free slots, and starts each at once.

    ``key_limit`` (``type`` utube or utubettl): at most that many tasks of one key run at
    once, by every worker together (``Tube.set_key_limit``; without it, one at a time); set
    on the tube as ``limit`` is. ``key_rate`` (utube types): at most that many of one key's
    tasks started per period (``"10/m"``: ``Tube.set_key_rate``), set as ``rate`` is.
    """
    name = check_name(name, "name")
    batch = check_count(batch, "batch", minimum=1)
    create = _tube_create(type, ttl, ttr, pri)
    batch_time = check_seconds(batch_time, "batch_time", allow_none=True, non_negative=True)
    concurrency = _check_concurrency(concurrency)
    limit = None if limit is None else check_count(limit, "limit", minimum=1)
    checked_rate = check_rate(rate, "rate")
    key_limit, checked_key_rate = check_key_limit(key_limit, type), check_key_rate(key_rate, type)

    def decorate(func: Callable[[Any], Any]) -> Handler:
        return _register(
            Handler(
                "tube",
                name,
                func,
                name,
                batch=batch,
                batch_time=batch_time,
                concurrency=concurrency,
                limit=limit,
                rate=checked_rate,
                key_limit=key_limit,
                key_rate=checked_key_rate,
                lease=create.get("ttr") or create.get("ttl") or 60.0,
                create=create,
            )
        )

    return decorate


def board(
    name: str,
    *,
    batch: int = 100,
    expiry: float = 600,
    batch_time: float | None = None,
    concurrency: int | None = None,
) -> Callable[[Callable[[Any], Any]], Handler]:
    """Register the decorated function to be called with each job claimed from board ``name``.

    Jobs are claimed up to ``batch`` at a time (most urgent, oldest first; as many as fit
    ``batch_time`` seconds of the handler's measured time) and run one after the other;
    ``batch=1`` leaves the rest of the board to other workers, for long jobs. Each claim
    expires after ``expiry`` seconds unless renewed; the worker renews it while the batch is in
    hand. The board is created when the worker starts if it does not exist.
    """
    name = check_name(name, "name")
    batch = check_count(batch, "batch", minimum=1)
    expiry = check_seconds(expiry, "expiry", positive=True)
    batch_time = check_seconds(batch_time, "batch_time", allow_none=True, non_negative=True)
    concurrency = _check_concurrency(concurrency)

    def decorate(func: Callable[[Any], Any]) -> Handler:
        return _register(
            Handler(
                "board",
                name,
                func,
                name,
                batch=batch,
                batch_time=batch_time,
                concurrency=concurrency,
                lease=expiry,
            )
        )

    return decorate


def _check_concurrency(concurrency: Any) -> int | None:
    """A handler's ``concurrency``: ``None`` (the worker's), or a count of at least 1."""
    return None if concurrency is None else check_count(concurrency, "concurrency", minimum=1)


def autodiscover() -> None:
    """Import the ``taskloop`` module of every installed app, registering its handlers."""
    try:
        autodiscover_modules("taskloop")
    except TypeError as error:
        message = explain_refused_options(error)
        if message is None:
            raise
        raise ImproperlyConfigured(message) from error


def serving(only: Iterable[str] | None = None) -> list[Handler]:
    """:func:`get_handlers`, or a ``ValueError`` saying what to configure if there is none."""
    handlers = get_handlers(only)
    if not handlers:
        raise ValueError(
            "nothing to serve: no handler is registered (@tube, @board, @loop, @lockable in an "
            "app's taskloop.py) and TASKS names no django_taskloop.backends.TaskloopBackend; for "
            'Django Tasks set TASKS = {"default": {"BACKEND": '
            '"django_taskloop.backends.TaskloopBackend"}} (README: Django Tasks)'
        )
    return handlers


def _named(asked: str, handlers: dict[str, Handler]) -> list[str]:
    """Return the names of the handlers ``asked`` selects: a handler's own name, a loop's model
    label in any case (Django spells them ``news.FeedLoop``), or a Django Tasks queue's name
    (its plain and keyed handlers); else ``[asked]``, unknown."""
    if asked in handlers:
        return [asked]
    loops = {name.lower(): name for name, handler in handlers.items() if handler.kind == "loop"}
    if asked.lower() in loops:
        return [loops[asked.lower()]]
    return [name for name, handler in handlers.items() if handler.queue == asked] or [asked]


def _known(handlers: dict[str, Handler]) -> str:
    """Say which names ``--only`` knows: the handlers', then the Django Tasks queues' (their
    internal tubes work too, but are no Tasks user's business)."""
    own = sorted(name for name, handler in handlers.items() if handler.queue is None)
    queues = sorted({handler.queue for handler in handlers.values() if handler.queue is not None})
    known = f"known: {own}"
    return f"{known}; Django Tasks queues: {queues}" if queues else known


def get_handlers(only: Iterable[str] | None = None) -> list[Handler]:
    """Return the handlers to run: every registered one (and the Tasks backend's queues), or
    those named in ``only``; an unknown name raises ``ValueError``."""
    autodiscover()
    handlers = dict(registry)
    for source in handler_sources:
        for handler in source():
            handlers.setdefault(handler.name, handler)
    if only:
        wanted = list(dict.fromkeys(name for asked in only for name in _named(asked, handlers)))
        unknown = [name for name in wanted if name not in handlers]
        if unknown:
            raise ValueError(f"unknown handler(s) {unknown}; {_known(handlers)}")
        return [handlers[name] for name in wanted]
    return list(handlers.values())
