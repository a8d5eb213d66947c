"""Options of a Django Task run by :class:`~django_taskloop.backends.TaskloopBackend`.

Django's ``@task(**options)`` (Django 6.1's ``django.tasks``; the ``django-tasks`` backport
0.12 on Django 5.2, the same mechanism) passes keyword arguments it does not know itself to the
backend's ``task_class``. The backend's ``task_class`` is :class:`TaskloopTask`, which adds::

    @task(max_attempts=5, backoff=10, ttl=3600, ttr=120, key=lambda user_id: f"user:{user_id}",
          unique="key", enqueue_on_commit=True)
    def sync_account(user_id): ...

``task.using(...)`` takes them too, for one call: ``sync_account.using(ttl=60).enqueue(7)``.
An option the backend does not know is the dataclass's ``TypeError``; a bad value is a
``TypeError`` or ``ValueError`` naming the option, raised where the task is defined (or
``using()`` is called), so that nothing bad is ever enqueued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.utils.module_loading import import_string

from .compat import TASKS_AVAILABLE, DjangoTask, Task, framework_task
from .conf import setting
from .runtime import backoff
from .validation import check_seconds

__all__ = ["TaskloopTask", "OPTION_NAMES", "task", "task_key", "check_options", "check_ttr"]

#: The options :class:`TaskloopTask` adds to Django's ``Task``.
OPTION_NAMES = ("max_attempts", "backoff", "ttl", "ttr", "key", "unique", "enqueue_on_commit")


def check_options(
    max_attempts: object = 1,
    backoff: object = None,
    ttl: object = None,
    ttr: object = None,
    key: object = None,
    unique: object = False,
    enqueue_on_commit: object = False,
) -> None:
    """Raise ``TypeError``/``ValueError`` naming the first bad option."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(f"max_attempts must be an int, not {type(max_attempts).__name__}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, not {max_attempts!r}")
    if backoff is not None and not callable(backoff):
        check_seconds(backoff, "backoff", non_negative=True)
    check_seconds(ttl, "ttl", allow_none=True, positive=True)
    check_ttr(ttr)
    if key is not None and not callable(key):
        if not isinstance(key, str):
            raise TypeError(f"key must be a str or a callable, not {type(key).__name__}")
        if not key:
            raise ValueError("key must not be empty")
    if unique not in (False, True, "args", "key") or not isinstance(unique, (bool, str)):
        raise ValueError(f"unique must be False, True, 'args' or 'key', not {unique!r}")
    if unique == "key" and key is None:
        raise ValueError("unique='key' needs a key: give the task a key (a str or a callable)")
    if not isinstance(enqueue_on_commit, bool):
        raise TypeError(f"enqueue_on_commit must be a bool, not {type(enqueue_on_commit).__name__}")
    if unique and enqueue_on_commit:
        # enqueue() returns before the commit: it could not return the waiting twin's result.
        raise ValueError("unique and enqueue_on_commit cannot be combined: the twin is known only at commit")


def check_ttr(ttr: Any) -> None:
    """Refuse a ``ttr`` that is not a positive number or is under two heartbeats.

    The worker renews a running task's lease at each heartbeat: a ttr shorter than two beats
    could run out under a healthy but busy worker, and the task would run twice.
    """
    check_seconds(ttr, "ttr", allow_none=True, positive=True)
    if ttr is None:
        return
    beat = float(setting("HEARTBEAT_INTERVAL"))
    if ttr < 2 * beat:
        raise ValueError(
            f"ttr must be at least twice TASKLOOP['HEARTBEAT_INTERVAL'] ({beat:g} s), "
            f"so at least {2 * beat:g}, not {ttr!r}"
        )


def task(function: Any = None, **options: Any) -> Any:
    """Django's ``@task`` that takes django-taskloop's options on every version.

    ``django.tasks``' own ``@task(max_attempts=3)`` works on Django 6.1+ and with the backport;
    Django 6.0's ``task()`` passes no unknown keyword on (a ``TypeError``). This one gives
    Django's decorator its own arguments and the rest to ``using()``, which every version
    routes to :class:`TaskloopTask`.

    Under another ``TASKS`` backend (Django's ``ImmediateBackend`` or ``DummyBackend`` in a
    test settings file, another queue in staging) the task is that backend's plain ``Task``
    and these options have no effect there: ``tasks.py`` imports and runs under any backend.
    """
    ours = {name: options.pop(name) for name in OPTION_NAMES if name in options}

    def wrapper(func: Any) -> Any:
        made = framework_task(**options)(func)
        if not ours or not isinstance(made, TaskloopTask):
            return made
        return made.using(**ours)

    return wrapper(function) if function is not None else wrapper


def function_path(function: object) -> str | None:
    """Return the dotted path that imports ``function`` back (None: a lambda, a nested or
    bound function, anything not reachable by name)."""
    path = f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}"
    try:
        return path if import_string(path) is function else None
    except ImportError:
        return None


def task_key(task: Any, args: Any, kwargs: Any) -> str | None:
    """Return the key of one call of ``task``: its ``key``, or what its callable key returns."""
    key = getattr(task, "key", None)
    if key is None:
        return None
    if callable(key):
        key = key(*args, **kwargs)
        if not isinstance(key, str) or not key:
            raise ValueError(f"key of {task.module_path} must return a non-empty str, not {key!r}")
    return key


if TASKS_AVAILABLE:

    @dataclass(frozen=True, slots=True, kw_only=True)
    class TaskloopTask(DjangoTask):
        """A Django ``Task`` with django-taskloop's options (see the module's docstring)."""

        #: Runs in all before the task ends FAILED (1: no retry). Any exception counts.
        max_attempts: int = 1
        #: Seconds before a retry: a number, or ``callable(attempt) -> seconds`` (attempt is
        #: 1-based, the attempt that failed); ``None``: the worker's exponential backoff
        #: (``TASKLOOP["RETRY_BACKOFF"]`` doubling up to ``RETRY_BACKOFF_MAX``).
        backoff: float | Callable[[int], float] | None = None
        #: Seconds from enqueue (or from ``run_after``) within which the task must start; later
        #: it ends FAILED with :class:`~django_taskloop.exceptions.TaskExpired`, never runs.
        ttl: float | None = None
        #: Lease of a running attempt: a worker that stops heart-beating for ``ttr`` seconds
        #: loses the task, and another worker runs it again (a new attempt).
        ttr: float | None = None
        #: Tasks with the same key run one at a time, in enqueue order. A ``str``, or a
        #: callable given the call's arguments that returns one.
        key: str | Callable[..., str] | None = None
        #: While an equal task waits (READY, not started), enqueue returns its result instead
        #: of adding another: ``"args"`` (same task, same arguments), ``"key"`` (same task,
        #: same key) or ``True`` (``"key"`` if the task has a key, else ``"args"``).
        unique: bool | str = False
        #: Enqueue when the surrounding transaction commits; nothing if it rolls back.
        enqueue_on_commit: bool = False

        def __post_init__(self) -> None:
            check_options(**self.options)
            # (Named, not super(): slots=True makes a new class that zero-argument super() misses.)
            Task.__post_init__(self)

        @property
        def options(self) -> dict[str, object]:
            """This task's django-taskloop options, by name."""
            return {name: getattr(self, name) for name in OPTION_NAMES}

        @property
        def unique_on(self) -> str | None:
            """What ``unique`` compares: ``"args"``, ``"key"`` or ``None`` (not unique)."""
            if self.unique is True:
                return "key" if self.key is not None else "args"
            return self.unique or None

        def using(self, **changes: Any) -> Any:
            """Return a copy with other defaults: Django's ``priority``, ``queue_name``,
            ``run_after``, ``backend``, and this backend's options."""
            ours = {name: changes.pop(name) for name in OPTION_NAMES if name in changes}
            if callable(ours.get("backoff")) and function_path(ours["backoff"]) is None:
                # A call's options travel with it to the worker as data: a function by its path.
                raise ValueError(
                    "a backoff given to using() must be a number, None or a module-level "
                    f"function (the worker imports it by name), not {ours['backoff']!r}"
                )
            task: DjangoTask = Task.using(self, **changes)
            return replace(task, **ours) if ours else task

        def retry_delay(self, attempt: int) -> float:
            """Return the seconds to wait after failed attempt ``attempt`` (1-based)."""
            if self.backoff is None:
                return backoff(attempt)
            if callable(self.backoff):
                delay = self.backoff(attempt)
                return check_seconds(delay, "backoff(attempt)", non_negative=True) or 0.0
            return float(self.backoff)

else:  # pragma: no cover
    TaskloopTask = None  # type: ignore[assignment,misc]
