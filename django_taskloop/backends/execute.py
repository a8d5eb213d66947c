"""The worker's side of :class:`~django_taskloop.backends.TaskloopBackend`: run a task a worker
has claimed and record how it ended — its attempts, a failure put back after its backoff or
ended for good (:class:`FailedForGood`), Django's ``task_started``/``task_finished`` signals and
the result written to its :class:`~django_taskloop.models.TaskRecord`."""

from __future__ import annotations

import inspect
from datetime import datetime
from typing import Any, NoReturn, cast

from django.db import IntegrityError
from django.db.models import Manager
from django.utils.module_loading import import_string

from .. import engine
from ..compat import DjangoTask, DjangoTaskResult, TaskContext, normalize_json, task_finished, task_started
from ..models import Task as TubeTask
from ..models import TaskRecord, TaskRecordStatus
from ..runtime import FailedForGood, StopNow, backoff, run_interruptibly
from ..task_calls import called_record, carrier
from ..task_options import TaskloopTask
from ..validation import check_seconds
from .queues import Backend, queue_tube
from .results import Results, error_entry

__all__ = ["TaskRunner", "Records"]

#: The manager of one database's task records (what the worker's steps pass each other).
Records = Manager[TaskRecord]

#: The options a tube task carries for its call's worker (JSON: see ``task_options``).
Options = dict[str, Any]


class TaskRunner:
    """Run a backend's claimed tasks, one attempt each, and record how they ended."""

    def __init__(self, backend: Backend, results: Results) -> None:
        self.backend = backend
        self.results = results

    def execute(self, result_id: str, worker_id: str, queued: TubeTask | None = None) -> None:
        """See ``TaskloopBackend.execute``."""
        # (A tube task read from a database knows which: its _state.db is set.)
        using = cast(str, queued._state.db) if queued is not None else self.results.database_of(result_id)
        manager = TaskRecord.objects.db_manager(using)
        if queued is None:
            # Called with the result id alone: a task no worker has started is read off
            # the tube task that carries its call.
            queued = carrier(result_id, using)
        data = getattr(queued, "data", None)
        options: Options = data.get("options", {}) if isinstance(data, dict) else {}
        record = self._start(manager, result_id, worker_id, options, using, queued)
        if record is None:
            return
        task = self._runnable(manager, record)
        result = self.results.to_result(record, task)
        task_started.send(type(self.backend), task_result=result)
        try:
            value = normalize_json(self._call(task, record, result))
        except StopNow:
            # A hard stop of the worker: the task runs again (its tube task is given back).
            manager.filter(pk=result_id, status=TaskRecordStatus.RUNNING).update(
                status=TaskRecordStatus.READY
            )
            raise
        except BaseException as error:  # SystemExit and KeyboardInterrupt end the task too
            self._failed(manager, record, task, options, queued, error, using)
        self._finish(manager, record, TaskRecordStatus.SUCCESSFUL, value, None)

    def _start(
        self,
        manager: Records,
        result_id: str,
        worker_id: str,
        options: Options,
        using: str,
        queued: TubeTask | None = None,
    ) -> TaskRecord | None:
        """Mark the record RUNNING for this attempt and return it; ``None`` if it finished
        already (or another worker started it). A record past its ttl ends FAILED here
        (:class:`FailedForGood`). The first start of a one-row enqueue writes the record
        from what ``queued`` carries."""
        expired: list[BaseException] = []
        # A plain read first: a locking read of a missing key would lock the gap it falls
        # in (InnoDB), and two workers starting new records would deadlock on it.
        fresh = not manager.filter(pk=result_id).exists()

        def start() -> TaskRecord | None:
            # (Built anew on each try: a retried transaction starts from scratch.)
            record = called_record(queued, result_id) if fresh else None
            if not fresh:
                record = manager.select_for_update().filter(pk=result_id).first()
            if record is None or record.status in (TaskRecordStatus.SUCCESSFUL, TaskRecordStatus.FAILED):
                # Finished already: the worker that ran it died before acknowledging.
                return None
            now = engine.db_now(using)
            # The ttl counts from the enqueue, or from run_after (a delay extends it, as in
            # the tube), on the database's clock like every deadline: TaskRecord.expiry,
            # which get_result() reads too. (The option in the data: records stored
            # before TaskRecord.ttl existed.)
            error = record.expiry(now, ttl=options.get("ttl"))
            if error is not None:
                expired.append(error)
            else:
                record.status = TaskRecordStatus.RUNNING
                record.started_at = record.started_at or now
                record.last_attempted_at = now
                record.worker_ids = [*record.worker_ids, worker_id]
            if fresh:
                record.save(using=using, force_insert=True)
            elif not expired:
                record.save(update_fields=["status", "started_at", "last_attempted_at", "worker_ids"])
            return record

        try:
            record = engine.run_in_transaction(TaskRecord, using, start)
        except IntegrityError:
            if not fresh:
                raise
            return None  # another worker wrote the record first: it runs the task
        if record is not None and expired:
            # It ended at its deadline, as get_result() has said since then.
            deadline = record.ttl_deadline(options.get("ttl"))
            self._finish(manager, record, TaskRecordStatus.FAILED, None, expired[0], finished_at=deadline)
            raise FailedForGood(f"task {record.id} ({record.task_path}) expired") from expired[0]
        return record

    def _runnable(self, manager: Records, record: TaskRecord) -> DjangoTask:
        """Return the Task ``record`` names; one that no longer imports ends FAILED."""
        try:
            return self.results.stored_task(record)
        except (ImportError, TypeError) as error:
            # The path no longer names a Task: nothing can run, and nothing will later.
            self._finish(manager, record, TaskRecordStatus.FAILED, None, error)
            raise FailedForGood(f"task {record.id}: {record.task_path} is not a Task") from error

    def _call(self, task: DjangoTask, record: TaskRecord, result: DjangoTaskResult) -> object:
        """Call the task's function with the record's arguments; return what it returned."""
        # An async def task's coroutine is awaited on the worker's event loop in this
        # thread (run_interruptibly), where a hard stop can interrupt and cancel it;
        # Task.call's async_to_sync would run it in a thread of its own, out of reach.
        call = task.func if inspect.iscoroutinefunction(task.func) else task.call
        if task.takes_context:
            return run_interruptibly(call, TaskContext(task_result=result), *record.args, **record.kwargs)
        return run_interruptibly(call, *record.args, **record.kwargs)

    def _failed(
        self,
        manager: Records,
        record: TaskRecord,
        task: DjangoTask,
        options: Options,
        queued: TubeTask | None,
        error: BaseException,
        using: str,
    ) -> NoReturn:
        """Put a failed attempt back after its backoff, or end the task FAILED; raise
        :class:`FailedForGood` either way (called while ``error`` is being handled)."""
        attempt = len(record.worker_ids)
        # What the enqueue asked (``using(max_attempts=1)`` included), never the definition's:
        # a call enqueued without options asked for one attempt.
        most = int(options.get("max_attempts", 1))
        if queued is not None:
            # The runner numbers the Failure row by its item's attempts: this record's
            # attempt, not the take count of this attempt's own tube task.
            queued.attempts = attempt
        if attempt < most:
            delay = self._retry(manager, record, task, options, attempt, error, using)
            raise FailedForGood(
                f"task {record.id} ({record.task_path}) failed (attempt {attempt} of {most}), "
                f"retrying in {delay:g} s"
            ) from error
        # task_finished is sent inside the caller's except block: its receivers log with
        # logger.exception(), which needs the exception being handled.
        self._finish(manager, record, TaskRecordStatus.FAILED, None, error)
        if options.get("retried"):
            # The one attempt an operator's retry gave a task that had failed for good.
            suffix = f" (attempt {attempt}, one more after an operator's retry)"
        else:
            suffix = f" (attempt {attempt} of {most})" if most > 1 else ""
        raise FailedForGood(f"task {record.id} ({record.task_path}) failed{suffix}") from error

    def _retry(
        self,
        manager: Records,
        record: TaskRecord,
        task: DjangoTask,
        options: Options,
        attempt: int,
        error: BaseException,
        using: str,
    ) -> float:
        """Make ``record`` READY again with ``error`` kept, and put it back after its backoff.

        One transaction: the record and a new tube task (``put`` with ``delay``) in its
        queue's tube (its key's sub-queue for a keyed task). Returns the delay.
        """
        if "backoff_path" in options:
            delay = (
                check_seconds(
                    import_string(options["backoff_path"])(attempt), "backoff(attempt)", non_negative=True
                )
                or 0.0
            )
        elif "backoff" in options:
            delay = backoff(attempt) if options["backoff"] is None else float(options["backoff"])
        elif isinstance(task, TaskloopTask):
            delay = task.retry_delay(attempt)
        else:  # the definition lost its options since: the worker's backoff
            delay = backoff(attempt)
        errors = [*record.errors, error_entry(error)]
        key = options.get("key")
        data: dict[str, object] = {"result": record.id, "task": record.task_path}
        if options:
            data["options"] = options

        def work() -> None:
            manager.filter(pk=record.pk).update(status=TaskRecordStatus.READY, errors=errors)
            tube = queue_tube(using, record.queue_name, keyed=key is not None)
            tube.put(data, pri=100 - record.priority, ttr=options.get("ttr"), delay=delay, utube=key)

        engine.run_in_transaction(TaskRecord, using, work, lock_first=False)
        return delay

    def _finish(
        self,
        manager: Records,
        record: TaskRecord,
        status: str,
        value: object,
        error: BaseException | None,
        finished_at: datetime | None = None,
    ) -> None:
        """Record how the task ended (``finished_at``: default now) and send ``task_finished``."""
        errors = list(record.errors)
        if error is not None:
            errors.append(error_entry(error))
        manager.filter(pk=record.pk).update(
            status=status,
            return_value=value,
            errors=errors,
            finished_at=finished_at if finished_at is not None else engine.DbNow(),
        )
        record.refresh_from_db()
        task_finished.send(type(self.backend), task_result=self.results.to_result(record))
