"""``TaskloopBackend``, the ``TASKS`` backend: Django's side of it (its checks, what it supports,
``enqueue``/``get_result``/``retry``), each job done by one of its parts —
:class:`~.enqueue.Enqueuer`, :class:`~.results.Results`, :class:`~.execute.TaskRunner` — and
how the package finds the backends of ``TASKS``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .. import shards
from ..compat import TASKS_AVAILABLE, BaseTaskBackend, DjangoTask, DjangoTaskResult, task_backends
from ..models import Task as TubeTask
from ..task_options import TaskloopTask
from ..validation import Rate, check_count, check_rate
from .enqueue import CHECKED, Enqueuer, check_task
from .execute import TaskRunner
from .results import Results

__all__ = ["TaskloopBackend", "taskloop_backend", "taskloop_backends"]


if TASKS_AVAILABLE:

    class TaskloopBackend(BaseTaskBackend):
        """Enqueue Django Tasks into tubes; ``manage.py workers`` runs them."""

        supports_defer = True
        supports_async_task = True
        supports_get_result = True
        supports_priority = True

        #: ``@task(max_attempts=…, backoff=…, ttl=…, ttr=…, key=…, unique=…, enqueue_on_commit=…)``
        task_class = TaskloopTask

        def __init__(self, alias: str, params: dict[str, Any]) -> None:
            super().__init__(alias, params)
            # Its parts, one job each: reading results, enqueueing, running what a worker claimed.
            self._results = Results(self)
            self._enqueuer = Enqueuer(self, self._results)
            self._runner = TaskRunner(self, self._results)
            # What an enqueue checks once, not per call: the app registry that was found to
            # hold django_taskloop (a test's new INSTALLED_APPS makes a registry of its own), and
            # the tasks Django's validate_task passed (a Task is frozen: the same one passes again).
            self._installed_in: object = None
            self._validated: set[DjangoTask] = set()

        def _refuse_if_not_installed(self) -> None:
            # Django 6 checks backends only once django.tasks is imported: fail clearly at use too.
            if self._installed_in is apps.app_configs:
                return
            if (error := self._not_installed()) is not None:
                raise ImproperlyConfigured(f"{error.msg} {error.hint}")
            self._installed_in = apps.app_configs

        def _not_installed(self) -> checks.Error | None:
            if apps.is_installed("django_taskloop"):
                return None
            return checks.Error(
                f"TASKS[{self.alias!r}] uses TaskloopBackend, but 'django_taskloop' is not in "
                "INSTALLED_APPS.",
                hint="Add 'django_taskloop' to INSTALLED_APPS and run migrate: the backend keeps "
                "its tasks and results in django_taskloop's tables.",
                id="taskloop.E003",
            )

        # (django-stubs type Django 6's check() as returning a list; Django extends a list with it.)
        def check(self, **kwargs: Any) -> Iterator[checks.CheckMessage]:  # type: ignore[override,unused-ignore]
            """taskloop.E003: the backend's models and workers need ``django_taskloop`` installed;
            taskloop.E004: ``OPTIONS["DATABASES"]`` names the shards, aliases of ``DATABASES``."""
            yield from super().check(**kwargs)
            if (error := self._not_installed()) is not None:
                yield error
            try:
                _ = self.databases
            except (TypeError, ValueError) as problem:
                yield checks.Error(f"TASKS[{self.alias!r}]: {problem}", id="taskloop.E004")
            try:
                _ = self.queue_limits(), self.queue_key_limits(), self.queue_key_rates()
            except (TypeError, ValueError) as problem:
                yield checks.Error(f"TASKS[{self.alias!r}]: {problem}", id="taskloop.E006")

        @property
        def databases(self) -> list[str] | None:
            """The shards of this backend's queues (``OPTIONS["DATABASES"]``), or ``None``."""
            return shards.backend_databases(self.options.get("DATABASES"))

        def queue_limits(self) -> dict[str, tuple[int | None, Rate | None]]:
            """Each queue's running limit and rate (``OPTIONS["LIMITS"]``, ``OPTIONS["RATES"]``:
            queue name → a count of at least 1, or a rate such as ``"100/m"``), for the queues
            that have either. Its plain and keyed tasks count together. Raises
            ``TypeError``/``ValueError`` naming the entry (the check ``taskloop.E006``)."""
            given = {key: self._by_queue(key) for key in ("LIMITS", "RATES")}
            limits = {
                queue: check_count(limit, f'OPTIONS["LIMITS"][{queue!r}]', minimum=1)
                for queue, limit in given["LIMITS"].items()
                if limit is not None
            }
            rates = {
                queue: check_rate(rate, f'OPTIONS["RATES"][{queue!r}]')
                for queue, rate in given["RATES"].items()
            }
            return {
                queue: (limits.get(queue), rates.get(queue))
                for queue in sorted({*limits, *rates})
                if limits.get(queue) is not None or rates.get(queue) is not None
            }

        def queue_key_limits(self) -> dict[str, int]:
            """Each queue's key limit (``OPTIONS["KEY_LIMITS"]``: queue name → a count of at
            least 1): at most that many of its tasks enqueued with one key run at once (on the
            queue's keyed tube: ``Tube.set_key_limit``; 1 or none: one at a time), for the
            queues that have one above 1. Raises ``TypeError``/``ValueError`` naming the entry
            (the check ``taskloop.E006``)."""
            return {
                queue: limit
                for queue, limit in self._by_queue("KEY_LIMITS").items()
                if limit is not None
                and check_count(limit, f'OPTIONS["KEY_LIMITS"][{queue!r}]', minimum=1) > 1
            }

        def queue_key_rates(self) -> dict[str, Rate]:
            """Each queue's key rate (``OPTIONS["KEY_RATES"]``: queue name → a rate such as
            ``"10/m"``): at most that many of its tasks enqueued with one key started per period
            (on the queue's keyed tube: ``Tube.set_key_rate``), for the queues that have one.
            Raises ``TypeError``/``ValueError`` naming the entry (the check ``taskloop.E006``)."""
            rates = {
                queue: check_rate(rate, f'OPTIONS["KEY_RATES"][{queue!r}]')
                for queue, rate in self._by_queue("KEY_RATES").items()
            }
            return {queue: rate for queue, rate in rates.items() if rate is not None}

        def _by_queue(self, key: str) -> dict[str, Any]:
            """``OPTIONS[key]``: a dict whose keys are among the backend's QUEUES ({} unset)."""
            entries = self.options.get(key) or {}
            if not isinstance(entries, dict):
                raise TypeError(f'OPTIONS["{key}"] must be a dict of queue names, not {entries!r}')
            for queue in entries:
                if queue not in self.queues:
                    raise ValueError(f'OPTIONS["{key}"] names {queue!r}, not one of the QUEUES')
            return entries

        def validate_task(self, task: DjangoTask) -> None:
            # Django's checks read only the task's fields and this backend's features and
            # queues, which do not change: a task that passed passes again (enqueue validates
            # every call: a dozen calls the less on its hot path).
            try:
                if task in self._validated:
                    return
            except TypeError:  # a task holding an unhashable value: checked every time
                pass
            super().validate_task(task)
            # The queue name becomes part of a tube name; the function must not be a generator.
            # Checked once per queue name and function.
            if (task.queue_name, task.func) not in CHECKED:
                check_task(task)
            if len(self._validated) >= 1024:  # tasks made per call (using(run_after=…)): bounded
                self._validated.clear()
            try:
                self._validated.add(task)
            except TypeError:
                pass

        def enqueue(
            self, task: DjangoTask, args: Iterable[object], kwargs: Mapping[str, object]
        ) -> DjangoTaskResult:
            """Put the call in its queue's tube and return its ``TaskResult`` (READY).

            One INSERT: the tube task carries the call (path, arguments, options) and the
            result reads from it until a worker starts the task, which writes the result's
            :class:`~django_taskloop.models.TaskRecord` (its id is ``"<tube task id>-<secret>"``).
            Two rows, all or nothing, only where the result must exist before the put: a
            ``unique`` task (its twin is found among the results) and an
            ``enqueue_on_commit`` task enqueued inside a transaction (its id is known now,
            its rows are written at commit). ``run_after`` is the task's "not before" on the
            database's clock, as a put's delay would be.
            """
            self._refuse_if_not_installed()
            self.validate_task(task)
            return self._enqueuer.enqueue(task, args, kwargs)

        def get_result(self, result_id: str) -> DjangoTaskResult:
            """Return the ``TaskResult`` of ``result_id`` as it is now.

            A task past its ``ttl`` reads FAILED (``TaskExpired``) at once, as the worker that
            reaches it will record it (:meth:`TaskRecord.expiry`), not READY until then.
            """
            return self._results.get_result(result_id)

        def retry(self, result_id: str) -> DjangoTaskResult:
            """Run the FAILED task ``result_id`` once more; return its ``TaskResult`` (READY).

            A new attempt of the same result, not a new result: its ``errors`` and
            ``worker_ids`` keep the attempts so far, its id stays the one callers hold. The
            task goes back to its queue (its key's sub-queue for a keyed task) at once, with
            no ``ttl`` (an operator asked for it now). One attempt only: if it fails again it
            is FAILED again, whatever ``max_attempts`` says. Raises
            ``TaskResultDoesNotExist`` for an unknown id and ``ValueError`` if the task is not
            FAILED or its path no longer names a Task.
            """
            return self._results.retry(result_id)

        def execute(self, result_id: str, worker_id: str, queued: TubeTask | None = None) -> None:
            """Run the task ``result_id`` and record how it ended (called by the worker).

            Whatever the task raises — ``SystemExit`` and ``KeyboardInterrupt`` included — ends
            it FAILED with that exception's class and traceback, and the worker carries on;
            so does a stored path that no longer names a Task (the callable is never called).
            Only a hard stop of the worker interrupts it: then it is READY again and its tube
            task goes back to run later (Django Tasks have no retry of their own, so FAILED
            would lose work that merely met a deploy). Raises :class:`FailedForGood` after
            recording a failure, so that the worker counts it as failed, not done.

            ``queued`` is the tube task that brought the call (its data carries the options of
            :mod:`.task_options`): a task with ``max_attempts`` left is READY again and put back
            after its backoff (a new tube task, the same record: its ``errors`` list every
            attempt); one with a ``ttl`` that was not started in time ends FAILED with
            :class:`~django_taskloop.exceptions.TaskExpired` and is never called.
            """
            self._runner.execute(result_id, worker_id, queued)

else:  # pragma: no cover - neither django.tasks nor the backport is installed
    # A class, or None without a framework (mypy sees the framework of its Python version).
    TaskloopBackend = None  # type: ignore[assignment,misc]


def taskloop_backends() -> list[TaskloopBackend]:
    """Return every ``TaskloopBackend`` of ``TASKS`` (none without a Tasks framework)."""
    if not TASKS_AVAILABLE:
        return []
    backends = [task_backends[alias] for alias in task_backends.settings]
    return [backend for backend in backends if isinstance(backend, TaskloopBackend)]


def taskloop_backend(alias: str) -> TaskloopBackend:
    """Return ``TASKS[alias]``, which must be a ``TaskloopBackend`` (``TypeError`` if not)."""
    backend = task_backends[alias]
    if not isinstance(backend, TaskloopBackend):
        raise TypeError(f"TASKS[{alias!r}] is a {type(backend).__name__}, not a TaskloopBackend")
    return backend
