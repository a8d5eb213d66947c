"""Job boards (OpenStack TaskFlow's jobboards) on the database: ``JobBoard``, ``Job``.

A board is a row; its jobs are rows that an owner claims (optionally with an expiry on the
database's clock), then consumes, abandons or trashes. Every verb is one short transaction on
the shared claim engine, and the errors follow SPEC §2 (TaskFlow's failure matrix, made
uniform): ``UnclaimableJob`` for a job that is already claimed, ``NotFound`` for a job or a
claim that is gone, ``JobFailure`` for a claim held by someone else.

A claim is live while ``claimed_by`` is set and ``claim_expires_at`` is null (never expires)
or still ahead of the database's clock. An expired claim therefore reads as unclaimed at once,
with no reaper; ``Job.objects.reap_expired()`` only tidies the columns up.
"""

from __future__ import annotations

import enum
import uuid as uuid_module
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Self

from asgiref.sync import sync_to_async
from django.core.validators import RegexValidator
from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import BooleanField, Case, F, Q, Value, When

from .. import engine
from ..conf import setting
from ..exceptions import JobFailure, NotFound, UnclaimableJob
from ..signals import job_posted, job_removed
from ..validation import (
    check_bool,
    check_count,
    check_json,
    check_name,
    check_owner,
    check_seconds,
    check_text,
    check_timeout,
)
from . import operating
from .entities import _KIND_LENGTH, BoardEntity, BoardEntityManager, BoardEntityQuerySet

__all__ = [
    "JobPriority",
    "JobBoard",
    "JobBoardQuerySet",
    "JobBoardManager",
    "Job",
    "JobQuerySet",
    "JobManager",
    "ConsumedJob",
    "BoardEntity",
    "BoardEntityQuerySet",
    "BoardEntityManager",
    "UNCLAIMED",
    "CLAIMED",
    "COMPLETE",
    "DOES_NOT_EXPIRE",
    "KEY_NOT_FOUND",
]

#: Job states, as TaskFlow spells them.
UNCLAIMED = "UNCLAIMED"
CLAIMED = "CLAIMED"
COMPLETE = "COMPLETE"

#: ``Job.expires_in()`` of a live claim made without an expiry.
DOES_NOT_EXPIRE = -1
#: ``Job.expires_in()`` of a job with no live claim (unclaimed, expired, consumed, trashed).
KEY_NOT_FOUND = -2

_OWNER_LENGTH = 255
_JOB_NAME_LENGTH = 255
_PAST = {"abandon": "abandoned", "consume": "consumed", "trash": "trashed"}


class JobPriority(enum.Enum):
    """How urgent a job is. Values are TaskFlow's (each member's own name)."""

    VERY_HIGH = "VERY_HIGH"
    HIGH = "HIGH"
    NORMAL = "NORMAL"
    LOW = "LOW"
    VERY_LOW = "VERY_LOW"

    @property
    def rank(self) -> int:
        """Return the stored sort key: 0 for ``VERY_HIGH`` up to 4 for ``VERY_LOW``."""
        return _RANKS[self]

    @classmethod
    def from_rank(cls, rank: int) -> JobPriority:
        """Return the member stored as ``rank``."""
        return _BY_RANK[rank]

    @classmethod
    def convert(cls, value: Any, name: str = "priority") -> JobPriority:
        """Return ``value`` as a member: a member, or a member's name in any case."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            member = cls.__members__.get(value.upper())
            if member is not None:
                return member
        raise ValueError(
            f"{name} must be a JobPriority or one of {', '.join(cls.__members__)}; not {value!r}"
        )

    @classmethod
    def reorder(cls, *pairs: tuple[Any, Any]) -> Any:
        """Return the values of ``(priority, value)`` pairs, most urgent first, stable within one.

        As in TaskFlow: one pair gives its value alone, more give a tuple.
        """
        if not pairs:
            raise ValueError("reorder() needs at least one (priority, value) pair")
        ordered = sorted(pairs, key=lambda pair: cls.convert(pair[0]).rank)
        if len(ordered) == 1:
            return ordered[0][1]
        return tuple(value for _, value in ordered)


_RANKS = {member: rank for rank, member in enumerate(JobPriority)}
_BY_RANK = {rank: member for member, rank in _RANKS.items()}


if TYPE_CHECKING:
    # django-stubs' fields are generic in what they are set to and what they give back; Django's
    # own classes cannot be subscripted.
    _RankField = models.PositiveSmallIntegerField[JobPriority | int | str, JobPriority]
else:
    _RankField = models.PositiveSmallIntegerField


class PriorityField(_RankField):
    """A :class:`JobPriority` stored as its rank, so that the column sorts most urgent first."""

    description = "A job priority, stored as a small integer rank (0 = VERY_HIGH)"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> JobPriority | None:
        return None if value is None else JobPriority.from_rank(value)

    def to_python(self, value: Any) -> JobPriority | None:
        if value is None or isinstance(value, JobPriority):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value in _BY_RANK:
            return JobPriority.from_rank(value)
        return JobPriority.convert(value)

    def get_prep_value(self, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return JobPriority.convert(value).rank


def _job_uuid(job: Any, name: str = "job") -> str:
    """Return the canonical uuid of ``job``: a ``Job``, a uuid ``str`` (any case) or ``UUID``."""
    if isinstance(job, Job):
        return job.uuid
    if isinstance(job, uuid_module.UUID):
        return str(job)
    if isinstance(job, str):
        try:
            return str(uuid_module.UUID(job))
        except ValueError:
            raise ValueError(f"{name} must be a Job or a job's uuid, not {job!r}")
    raise TypeError(f"{name} must be a Job, a uuid str or a uuid.UUID, not {type(job).__name__}")


def _job_uuids(jobs: Any) -> tuple[list[str], dict[str, Job]]:
    """Return the distinct uuids of ``jobs`` (first occurrence first) and the ``Job`` instances given.

    ``jobs`` is an iterable of what ``_job_uuid`` takes; every item is checked before anything
    is written.
    """
    if isinstance(jobs, (str, bytes, uuid_module.UUID, Job)) or not isinstance(jobs, Iterable):
        raise TypeError(f"jobs must be an iterable of Jobs or job uuids, not {type(jobs).__name__}")
    uuids: dict[str, None] = {}
    instances: dict[str, Job] = {}
    for index, job in enumerate(jobs):
        job_uuid = _job_uuid(job, f"jobs[{index}]")
        uuids.setdefault(job_uuid, None)
        if isinstance(job, Job):
            instances.setdefault(job_uuid, job)
    return list(uuids), instances


def _claimable() -> Q:
    """Jobs nobody holds: never claimed, abandoned, or whose claim has expired."""
    return Q(claimed_by__isnull=True) | Q(claim_expires_at__lte=engine.DbNow())


def _live_claim() -> Q:
    return Q(claimed_by__isnull=False) & (
        Q(claim_expires_at__isnull=True) | Q(claim_expires_at__gt=engine.DbNow())
    )


def _live_claim_flag() -> Case:
    """Whether a job is under a live claim, as a column."""
    return Case(When(_live_claim(), then=Value(True)), default=Value(False), output_field=BooleanField())


class _NotAllHeld(Exception):
    """An optimistic ``consume_many`` found a job that its caller no longer holds."""


def _keep_history(rows: list[Job], who: str, using: str) -> None:
    """Keep a :class:`ConsumedJob` copy of each job of ``rows`` (as stored) consumed by ``who``."""
    ConsumedJob.objects.db_manager(using).bulk_create(
        [
            ConsumedJob(
                uuid=row.uuid,
                board_id=row.board_id,
                name=row.name,
                details=row.details,
                priority=row.priority,
                created_on=row.created_on,
                consumed_by=who,
                consumed_at=engine.DbNow(),
            )
            for row in rows
        ]
    )


# -- boards ----------------------------------------------------------------------------------


class JobBoardQuerySet(models.QuerySet["JobBoard"]):
    """Boards, and ``create_board``."""

    def create_board(self, name: str, if_not_exists: bool = False) -> JobBoard:
        """Create the board ``name`` and return it.

        An existing name raises ``ValueError``, unless ``if_not_exists`` is true: then the
        existing board is returned.
        """
        name = check_name(name)
        if_not_exists = check_bool(if_not_exists, "if_not_exists")
        using = self.db

        def work() -> JobBoard:
            existing = JobBoard._base_manager.db_manager(using).filter(name=name).first()
            if existing is not None:
                if if_not_exists:
                    return existing
                raise ValueError(f"name: a job board named {name!r} already exists")
            board = JobBoard(name=name, created_on=engine.DbNow())
            board.save(using=using, force_insert=True)
            board.refresh_from_db(using=using, fields=["created_on"])
            return board

        try:
            return engine.run_in_transaction(JobBoard, using, work)
        except IntegrityError:
            # A rival created it between our read and our insert.
            if connections[using].in_atomic_block or not if_not_exists:
                raise ValueError(f"name: a job board named {name!r} already exists")
            return JobBoard._base_manager.db_manager(using).get(name=name)


JobBoardManagerBase = models.Manager.from_queryset(JobBoardQuerySet)


class JobBoardManager(JobBoardManagerBase["JobBoard"]):
    """Manager of :class:`JobBoard`: ``JobBoard.objects.create_board(name)``."""


class JobBoard(models.Model):
    """A named board where jobs are posted, claimed, consumed, abandoned and trashed."""

    name = models.CharField(
        max_length=100,
        # A pattern string, not validation.NAME_RE: migrations cannot serialise a regex compiled with re.ASCII.
        validators=[
            RegexValidator(r"\A[A-Za-z0-9_.\-]{1,100}\Z", "Use 1-100 letters, digits, '_', '-' or '.'.")
        ],
    )
    created_on = models.DateTimeField(editable=False)

    objects = JobBoardManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_board"
        ordering = ["name"]
        verbose_name = "job board"
        constraints = [models.UniqueConstraint(fields=["name"], name="taskloop_board_name_uniq")]

    def __str__(self) -> str:
        return self.name

    # -- helpers ------------------------------------------------------------------------------

    @property
    def _alias(self) -> str:
        return self._state.db or router.db_for_write(type(self), instance=self)

    @property
    def using(self) -> str:
        """The alias of the database this board and its jobs live on."""
        return self._alias

    def _jobs(self) -> JobQuerySet:
        """This board's live (not trashed) jobs, on the board's database."""
        return Job.objects.db_manager(self._alias).filter(board=self, trashed=False)

    def _locked_job(self, job: Any) -> Job | None:
        """Read ``job`` (live, on this board) under a row lock, with its claim's liveness."""
        job_uuid = _job_uuid(job)
        # (django-stubs refuses an annotation named as an attribute the model declares, here
        # Job.live_claim: typeddjango/django-stubs#2818.)
        return (
            self._jobs()  # type: ignore[no-redef]
            .select_for_update()
            .annotate(live_claim=_live_claim_flag())
            .filter(uuid=job_uuid)
            .first()
        )

    def _held_by(self, job: Any, who: str, verb: str) -> Job:
        """Return ``job`` locked, if ``who`` holds a live claim on it; else raise per SPEC §2."""
        row = self._locked_job(job)
        if row is None:
            raise NotFound(f"job {_job_uuid(job)} not found to be {_PAST[verb]} on board {self.name!r}")
        if not row.live_claim:
            raise NotFound(f"cannot {verb} job {row.uuid}: it is not claimed")
        if row.claimed_by != who:
            raise JobFailure(
                f"cannot {verb} job {row.uuid}: it is not owned by {who!r} (it is owned by {row.claimed_by!r})"
            )
        return row

    # -- verbs --------------------------------------------------------------------------------

    def post(
        self, name: str, details: dict[str, Any] | None = None, priority: Any = JobPriority.NORMAL
    ) -> Job:
        """Post a job named ``name`` and return it (UNCLAIMED)."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if len(name) > _JOB_NAME_LENGTH:
            raise ValueError(f"name must be at most {_JOB_NAME_LENGTH} characters, not {len(name)}")
        if details is None:
            details = {}
        if not isinstance(details, dict):
            raise TypeError(f"details must be a dict, not {type(details).__name__}")
        # Validate at write time: a posting that cannot be read back would break iterjobs.
        check_json(details, "details")
        check_text(name, "name")
        priority = JobPriority.convert(priority)
        return self._post(name, details, priority)

    def _post(self, name: str, details: dict[str, Any], priority: JobPriority) -> Job:
        using = self._alias

        def work() -> Job:
            now = engine.DbNow()
            job = Job(
                board=self,
                uuid=str(uuid_module.uuid4()),
                name=name,
                details=details,
                priority=priority,
                created_on=now,
                last_modified=now,
            )
            job.save(using=using, force_insert=True)
            job.refresh_from_db(using=using, fields=["created_on", "last_modified"])
            transaction.on_commit(lambda: job_posted.send(sender=Job, job=job), using=using)
            return job

        return engine.run_in_transaction(Job, using, work)

    def claim(self, job: Any, who: str, expiry: float | None = None) -> Job:
        """Claim ``job`` for ``who`` (for ``expiry`` seconds, or until released) and return it.

        A job already claimed, even by ``who``, raises ``UnclaimableJob``; a job that is gone
        raises ``NotFound``.
        """
        job_uuid = _job_uuid(job)
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        expiry = check_seconds(expiry, "expiry", allow_none=True, positive=True)

        def work() -> Job:
            row = self._locked_job(job_uuid)
            if row is None:
                raise NotFound(f"job {job_uuid} not found to be claimed on board {self.name!r}")
            if row.live_claim:
                raise UnclaimableJob(f"job {job_uuid} already claimed by {row.claimed_by!r}")
            return self._write_claim(row.pk, who, expiry)

        return engine.run_in_transaction(Job, self._alias, work)

    def _write_claim(self, pk: int, who: str, expiry: float | None) -> Job:
        rows = Job.objects.db_manager(self._alias).filter(pk=pk)
        rows.update(
            claimed_by=who,
            claim_expires_at=None if expiry is None else engine.DbNow(expiry),
            last_modified=engine.DbNow(),
            attempts=F("attempts") + 1,
        )
        return rows.get()

    def claim_next(self, who: str, expiry: float | None = None) -> Job | None:
        """Claim the most urgent, oldest unclaimed job for ``who`` and return it, or ``None``."""
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        expiry = check_seconds(expiry, "expiry", allow_none=True, positive=True)
        claimed = self._claim_best(who, 1, expiry)
        return claimed[0] if claimed else None

    def claim_many(self, who: str, limit: int, expiry: float | None = None) -> list[Job]:
        """Claim up to ``limit`` of the most urgent, oldest unclaimed jobs for ``who``.

        Return them in claim order (most urgent first, then oldest), each claimed as
        :meth:`claim_next` claims one; ``[]`` when there is none or the board is paused.
        """
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        limit = check_count(limit, "limit", minimum=1)
        expiry = check_seconds(expiry, "expiry", allow_none=True, positive=True)
        return self._claim_best(who, limit, expiry)

    def _claim_best(self, who: str, limit: int, expiry: float | None) -> list[Job]:
        if operating.is_paused("job", self.name, self._alias, fresh=False):
            return []
        claimed: list[Job] = engine.claim(
            self._jobs(),
            limit=limit,
            # No candidate read: every claimer would read the same head of the queue, and all
            # but one would lose it (with one job, always) and scan anyway. The locking index
            # scan skips what rivals hold from the start (measured: fewer statements, and no
            # process starved, where one of four claimed 70 of 20,000 jobs before).
            direct=True,
            claimable=_claimable(),
            order_by=["priority", "sequence"],
            changes={
                "claimed_by": who,
                "claim_expires_at": None if expiry is None else engine.DbNow(expiry),
                "last_modified": engine.DbNow(),
                # Claims so far, so that a worker can trash a job that keeps failing.
                "attempts": F("attempts") + 1,
            },
            fetch=True,
        )
        return claimed

    def abandon(self, job: Any, who: str) -> None:
        """Give up ``who``'s claim on ``job``: it is UNCLAIMED again, for anyone to claim."""
        job_uuid = _job_uuid(job)
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)

        def work() -> None:
            row = self._held_by(job_uuid, who, "abandon")
            Job.objects.db_manager(self._alias).filter(pk=row.pk).update(
                claimed_by=None, claim_expires_at=None, last_modified=engine.DbNow()
            )

        engine.run_in_transaction(Job, self._alias, work)

    def consume(self, job: Any, who: str) -> None:
        """Remove ``job``, claimed by ``who``, for good: its work is done (state COMPLETE).

        With ``TASKLOOP["JOB_HISTORY_RETENTION"] > 0`` a copy is kept as a
        :class:`ConsumedJob` until ``Job.objects.prune_history()`` removes it.
        """
        job_uuid = _job_uuid(job)
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        using = self._alias

        keep_history = setting("JOB_HISTORY_RETENTION") > 0

        def work() -> None:
            if isinstance(job, Job) and not keep_history:
                # Fast path, the one workers take: one conditional DELETE of a job that ``who``
                # holds, and the caller's instance for the signal. Only a refusal reads the row,
                # to say why.
                held = self._jobs().filter(_live_claim(), uuid=job_uuid, claimed_by=who)
                if held.delete()[0]:
                    transaction.on_commit(lambda: job_removed.send(sender=Job, job=job), using=using)
                    return
            row = self._held_by(job_uuid, who, "consume")
            if keep_history:
                _keep_history([row], who, using)
            Job.objects.db_manager(using).filter(pk=row.pk).delete()
            transaction.on_commit(lambda: job_removed.send(sender=Job, job=row), using=using)

        engine.run_in_transaction(Job, using, work)

    def consume_many(self, jobs: Iterable[Any], who: str) -> int:
        """Consume every job of ``jobs`` that ``who`` holds (a live claim); return how many.

        Each is removed as :meth:`consume` removes one (``job_removed`` at commit, a
        :class:`ConsumedJob` copy with ``TASKLOOP["JOB_HISTORY_RETENTION"] > 0``); jobs that
        ``who`` does not hold (claimed by another, unclaimed, expired, gone) are left alone
        and not counted. One ``DELETE`` per slice of ids that fits a statement.
        """
        uuids, instances = _job_uuids(jobs)
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        using = self._alias
        keep_history = setting("JOB_HISTORY_RETENTION") > 0
        # Whole rows only where they are needed: for the history, or for the signal of a job
        # given by its uuid. Otherwise the caller's instances go with the signal, as in consume.
        whole_rows = keep_history or len(instances) < len(uuids)

        def work(optimistic: bool) -> int:
            removed: list[Job] = []
            for chunk in engine.batched(uuids, using):
                held = self._jobs().filter(_live_claim(), uuid__in=chunk, claimed_by=who)
                if optimistic:
                    # Workers' path: one conditional DELETE. If it removed every job given, those
                    # were exactly the held ones; if not, roll back and find out which were.
                    if held.delete()[1].get(Job._meta.label, 0) != len(chunk):
                        raise _NotAllHeld
                    removed.extend(instances[job_uuid] for job_uuid in chunk)
                    continue
                held = held.select_for_update()
                pks: list[Any]
                if whole_rows:
                    rows = list(held)
                    pks = [row.pk for row in rows]
                    if keep_history:
                        _keep_history(rows, who, using)
                    removed.extend(instances.get(row.uuid, row) for row in rows)
                else:
                    pairs = list(held.values_list("pk", "uuid"))
                    pks = [pk for pk, _ in pairs]
                    removed.extend(instances[job_uuid] for _, job_uuid in pairs)
                if pks:
                    Job.objects.db_manager(using).filter(pk__in=pks).delete()
            if removed:

                def announce() -> None:
                    for job in removed:
                        job_removed.send(sender=Job, job=job)

                transaction.on_commit(announce, using=using)
            return len(removed)

        if not uuids:
            return 0
        # Optimistic only as the outermost transaction: the roll-back undoes no caller's work.
        if not whole_rows and not connections[using].in_atomic_block:
            try:
                return engine.run_in_transaction(Job, using, lambda: work(optimistic=True))
            except _NotAllHeld:
                pass
        return engine.run_in_transaction(Job, using, lambda: work(optimistic=False))

    def abandon_many(self, jobs: Iterable[Any], who: str) -> int:
        """Give up ``who``'s claims on ``jobs``; return how many were given up.

        As :meth:`abandon` does for one; jobs that ``who`` does not hold are left alone and not
        counted. One ``UPDATE`` per slice of ids that fits a statement.
        """
        uuids, _ = _job_uuids(jobs)
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        using = self._alias

        def work() -> int:
            return sum(
                self._jobs()
                .filter(_live_claim(), uuid__in=chunk, claimed_by=who)
                .update(claimed_by=None, claim_expires_at=None, last_modified=engine.DbNow())
                for chunk in engine.batched(uuids, using)
            )

        if not uuids:
            return 0
        return engine.run_in_transaction(Job, using, work)

    def extend_many(self, jobs: Iterable[Any], who: str, seconds: float) -> int:
        """Extend ``who``'s live claims on ``jobs`` to ``seconds`` from now; return how many.

        As :meth:`Job.extend_expiry` does for one, for the claims ``who`` still holds (a job
        consumed, abandoned, lost or taken over meanwhile stays as it is). One ``UPDATE`` per
        slice of ids that fits a statement: what a worker's heartbeat does for its batch.
        """
        uuids, _ = _job_uuids(jobs)
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        seconds = check_seconds(seconds, "seconds", positive=True)
        using = self._alias
        if not uuids:
            return 0
        chunks = list(engine.batched(uuids, using))

        def work() -> int:
            return sum(
                self._jobs()
                .filter(_live_claim(), trashed=False, uuid__in=chunk, claimed_by=who)
                .update(claim_expires_at=engine.DbNow(seconds), last_modified=engine.DbNow())
                for chunk in chunks
            )

        # Through the engine, as every write of ours: retried when the database is busy, and on
        # SQLite in the writers' turn (a renewal that met the busy handler instead lost the lock
        # to writers taking turns back to back, for longer than a lease).
        return engine.run_in_transaction(Job, using, work, alone=len(chunks) == 1)

    def trash(self, job: Any, who: str) -> None:
        """Take ``job``, claimed by ``who``, off the board for good, keeping it for review."""
        job_uuid = _job_uuid(job)
        who = check_owner(who, "who", max_length=_OWNER_LENGTH)
        using = self._alias

        def work() -> None:
            row = self._held_by(job_uuid, who, "trash")
            rows = Job.objects.db_manager(using).filter(pk=row.pk)
            rows.update(
                trashed=True,
                trashed_by=who,
                trashed_at=engine.DbNow(),
                claimed_by=None,
                claim_expires_at=None,
                last_modified=engine.DbNow(),
            )
            trashed = rows.get()
            transaction.on_commit(lambda: job_removed.send(sender=Job, job=trashed), using=using)

        engine.run_in_transaction(Job, using, work)

    def repost(self, job: Any) -> Job:
        """Post a trashed ``job`` again (same name, details and priority); return the new job."""
        job_uuid = _job_uuid(job)
        old = Job.objects.db_manager(self._alias).filter(board=self, uuid=job_uuid).first()
        if old is None:
            raise NotFound(f"job {job_uuid} not found on board {self.name!r}")
        if not old.trashed:
            raise JobFailure(f"cannot repost job {job_uuid}: it is not trashed")
        using = self._alias

        def work() -> Job:
            # Marked under its row lock, so that two re-posts at once make one copy.
            row = Job.objects.db_manager(using).select_for_update().get(pk=old.pk)
            if row.reposted_as:
                raise JobFailure(
                    f"cannot repost job {job_uuid}: it was re-posted already as {row.reposted_as}"
                )
            new = self._post(row.name, row.details, row.priority)
            Job.objects.db_manager(using).filter(pk=row.pk).update(reposted_as=new.uuid)
            return new

        return engine.run_in_transaction(Job, using, work)

    def edit_job(self, job: Any, **changes: Any) -> int:
        """Write ``changes`` (``priority``, ``details``) to a live job of this board; return 1,
        or 0 if it is trashed or gone, or (for new ``details``) under a live claim.

        TaskFlow has no verb for this (the admin's edit form and priority action use it). The
        state check and the write happen under one write lock, so a claim cannot slip in
        between; ``last_modified`` becomes the database's time.
        """
        job_uuid = _job_uuid(job)
        unknown = set(changes) - {"priority", "details"}
        if unknown:
            raise TypeError(f"edit_job() can change priority and details, not {', '.join(sorted(unknown))}")
        if "priority" in changes:
            changes["priority"] = JobPriority.convert(changes["priority"])
        condition = Q(board=self, uuid=job_uuid, trashed=False)
        if "details" in changes:
            details = changes["details"]
            if not isinstance(details, dict):
                raise TypeError(f"details must be a dict, not {type(details).__name__}")
            check_json(details, "details")
            # Nobody holds it: never claimed, abandoned, or its claim expired.
            condition &= _claimable()
        using = self._alias

        def work() -> int:
            rows = Job.objects.db_manager(using).filter(condition)
            return rows.update(**changes, last_modified=engine.DbNow())

        return engine.run_in_transaction(Job, using, work)

    def pause(self) -> None:
        """Stop handing out jobs (claim_next returns None, workers claim nothing) until
        :meth:`resume`; post, explicit claim() and every other verb still work. Twice is a no-op."""
        operating.pause("job", self.name, self._alias)

    def resume(self) -> None:
        """Hand out jobs again after :meth:`pause`."""
        operating.resume("job", self.name, self._alias)

    @property
    def paused(self) -> bool:
        """Whether the board is paused (read from the database)."""
        return operating.is_paused("job", self.name, self._alias)

    def iterjobs(self, only_unclaimed: bool = False, ensure_fresh: bool = False) -> Iterator[Job]:
        """Iterate over the board's jobs, most urgent first, then oldest first.

        The database is always fresh, so ``ensure_fresh`` changes nothing. As in TaskFlow, the
        jobs are read once, when iteration starts.
        """
        only_unclaimed = check_bool(only_unclaimed, "only_unclaimed")
        check_bool(ensure_fresh, "ensure_fresh")
        jobs = self._jobs()
        if only_unclaimed:
            jobs = jobs.filter(_claimable())

        def snapshot() -> Iterator[Job]:
            yield from list(jobs.order_by("priority", "sequence"))

        return snapshot()

    def wait(self, timeout: float | None = None) -> Iterator[Job]:
        """Wait until the board has any job, then return ``iterjobs()``.

        Raise ``NotFound`` if none arrives within ``timeout`` seconds (``None``: forever).
        """
        timeout = check_timeout(timeout)
        if not engine.poll(lambda: self._jobs().exists(), timeout, using=self._alias, what="board.wait()"):
            raise NotFound(
                f"expired waiting for jobs to arrive on board {self.name!r}; waited {timeout} seconds"
            )
        return self.iterjobs()

    @property
    def job_count(self) -> int:
        """Return the number of unclaimed and claimed jobs (not consumed or trashed)."""
        return self._jobs().count()

    def find_owner(self, job: Any) -> str | None:
        """Return who holds a live claim on ``job``, or ``None``."""
        job_uuid = _job_uuid(job)
        return self._jobs().filter(_live_claim(), uuid=job_uuid).values_list("claimed_by", flat=True).first()

    def register_entity(self, kind: str, name: str, metadata: dict[str, Any] | None = None) -> BoardEntity:
        """Record that entity ``name`` of ``kind`` (e.g. a conductor) is alive; return its record.

        Each call is a heartbeat: it sets ``last_seen`` to the database's time (and replaces
        ``metadata`` when given). Entities that stop calling show up as stale.
        """
        kind = check_owner(kind, "kind", max_length=_KIND_LENGTH)
        name = check_owner(name, "name", max_length=_OWNER_LENGTH)
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
            check_json(metadata, "metadata")
        using = self._alias
        entities = BoardEntity.objects.db_manager(using).filter(board=self, kind=kind, name=name)

        def work() -> BoardEntity:
            changes: dict[str, Any] = {"last_seen": engine.DbNow()}
            if metadata is not None:
                changes["metadata"] = metadata
            if not entities.update(**changes):
                now = engine.DbNow()
                BoardEntity(
                    board=self,
                    kind=kind,
                    name=name,
                    metadata=metadata or {},
                    registered_on=now,
                    last_seen=now,
                ).save(using=using, force_insert=True)
            return entities.get()

        try:
            return engine.run_in_transaction(BoardEntity, using, work)
        except IntegrityError:
            if connections[using].in_atomic_block:
                raise
            # A rival registered the same entity between our update and our insert: beat again.
            return engine.run_in_transaction(BoardEntity, using, work)

    async def apost(
        self, name: str, details: dict[str, Any] | None = None, priority: Any = JobPriority.NORMAL
    ) -> Job:
        """``await board.apost(...)``: :meth:`post` from async code (same arguments, errors and
        result), in Django's thread for sync code (``sync_to_async(thread_sensitive=True)``)."""
        return await sync_to_async(self.post, thread_sensitive=True)(name, details, priority)


# -- jobs ------------------------------------------------------------------------------------


class JobQuerySet(models.QuerySet["Job"]):
    """Named states of jobs, read with the database's clock, and the upkeep the reaper runs.

    Every job on a board is in exactly one of :attr:`STATES`: ``unclaimed`` (never claimed, or
    abandoned), ``claimed`` (under a live claim), ``expired`` (its claim's expiry has passed:
    TaskFlow's UNCLAIMED, claimable again, its columns not tidied up yet) or ``trashed``.
    :meth:`claimable` is ``unclaimed`` and ``expired`` together.
    """

    #: The states, in the order the admin and the metrics list them.
    STATES = ("unclaimed", "claimed", "expired", "trashed")

    @staticmethod
    def state_condition(name: str) -> Q:
        """Return state ``name`` as a ``Q`` (for a filter, or an aggregate's ``filter=``)."""
        if name == "unclaimed":
            return Q(trashed=False, claimed_by__isnull=True)
        if name == "claimed":
            return Q(trashed=False) & _live_claim()
        if name == "expired":
            return Q(trashed=False, claimed_by__isnull=False, claim_expires_at__lte=engine.DbNow())
        if name == "trashed":
            return Q(trashed=True)
        raise ValueError(f"name must be one of {', '.join(JobQuerySet.STATES)}, not {name!r}")

    def claimable(self) -> Self:
        """Jobs nobody holds (never claimed, abandoned, or with an expired claim), not trashed."""
        return self.filter(_claimable(), trashed=False)

    def unclaimed(self) -> Self:
        """Jobs never claimed, or abandoned (not those whose claim expired), not trashed."""
        return self.filter(self.state_condition("unclaimed"))

    def claimed(self) -> Self:
        """Jobs under a live claim."""
        return self.filter(self.state_condition("claimed"))

    def expired(self) -> Self:
        """Jobs whose claim's expiry has passed: claimable again (the reaper clears the claim)."""
        return self.filter(self.state_condition("expired"))

    def trashed(self) -> Self:
        """Jobs in the trash."""
        return self.filter(self.state_condition("trashed"))

    def in_state(self, name: str) -> Self:
        """The jobs in state ``name``, one of :attr:`STATES`."""
        return self.filter(self.state_condition(name))

    def state_counts(self) -> dict[str, int]:
        """Return ``{state: number of jobs}`` for every name of :attr:`STATES` (one read)."""
        counts = self.order_by().aggregate(
            **{name: models.Count("pk", filter=self.state_condition(name)) for name in self.STATES}
        )
        return {name: int(counts[name] or 0) for name in self.STATES}

    def in_claim_order(self) -> Self:
        """These jobs in the order claims hand them out: priority, then posting order."""
        return self.order_by("priority", "sequence")

    def reap_expired(self) -> int:
        """Clear every claim here whose expiry has passed; return how many.

        Expired claims already read as unclaimed; this only tidies the columns up.
        """
        return self.filter(claimed_by__isnull=False, claim_expires_at__lte=engine.DbNow()).update(
            claimed_by=None, claim_expires_at=None
        )

    def prune_history(self) -> int:
        """Delete consumed-job history older than ``TASKLOOP["JOB_HISTORY_RETENTION"]``; return how many."""
        retention = float(setting("JOB_HISTORY_RETENTION"))
        old = ConsumedJob.objects.db_manager(self.db).filter(consumed_at__lte=engine.DbNow(-retention))
        return old.delete()[0]


JobManagerBase = models.Manager.from_queryset(JobQuerySet)


class JobManager(JobManagerBase["Job"]):
    """Manager of :class:`Job`: ``reap_expired()``, ``prune_history()``, ``claimable()``."""


class Job(models.Model):
    """A job posted on a :class:`JobBoard`.

    ``state``, ``owner`` and ``expires_in()`` are read live from the database.
    """

    #: Posting order: the auto-increment key, so that "oldest first" is exact.
    sequence = models.BigAutoField(primary_key=True)
    uuid = models.CharField(max_length=36, editable=False)
    board = models.ForeignKey(JobBoard, on_delete=models.CASCADE, related_name="jobs", db_index=False)
    name = models.CharField(max_length=_JOB_NAME_LENGTH)
    details = models.JSONField(default=dict, blank=True)
    priority = PriorityField(default=JobPriority.NORMAL)
    claimed_by = models.CharField(max_length=_OWNER_LENGTH, null=True, blank=True, editable=False)
    claim_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_on = models.DateTimeField(editable=False)
    last_modified = models.DateTimeField(editable=False)
    trashed = models.BooleanField(default=False, editable=False)
    trashed_by = models.CharField(max_length=_OWNER_LENGTH, null=True, blank=True, editable=False)
    trashed_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: The uuid of the job this trashed job was re-posted as (a job is re-posted once).
    reposted_as = models.CharField(max_length=36, null=True, blank=True, editable=False)
    #: Times the job has been claimed (workers trash it after TASKLOOP["MAX_ATTEMPTS"] failures).
    attempts = models.PositiveIntegerField(default=0, editable=False)
    #: Not a column: a row read under its lock with its claim's liveness (JobBoard._locked_job).
    live_claim: bool

    objects = JobManager()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_job"
        ordering = ["priority", "sequence"]
        constraints = [models.UniqueConstraint(fields=["uuid"], name="taskloop_job_uuid_uniq")]
        indexes = [
            # claim_next and iterjobs: a board's jobs, most urgent first, then oldest. Trashed jobs
            # stay in it (few; a boolean prefix would not be searchable on SQLite, "NOT trashed").
            models.Index(fields=["board", "priority", "sequence"], name="taskloop_job_claim_idx"),
            # reap_expired.
            models.Index(fields=["claim_expires_at"], name="taskloop_job_expiry_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.uuid})"

    @property
    def _alias(self) -> str:
        return self._state.db or router.db_for_write(type(self), instance=self)

    def _read(self) -> Mapping[str, Any] | None:
        """Read this job's row and its claim's liveness, computed on the database's clock."""
        return (
            Job.objects.db_manager(self._alias)
            .filter(pk=self.pk)
            .annotate(claim_is_live=_live_claim_flag(), db_now=engine.DbNow())
            .values("trashed", "claimed_by", "claim_expires_at", "claim_is_live", "db_now")
            .first()
        )

    @property
    def state(self) -> str:
        """Return ``"UNCLAIMED"``, ``"CLAIMED"`` or ``"COMPLETE"`` (consumed or trashed), read live."""
        row = self._read()
        if row is None or row["trashed"]:
            return COMPLETE
        return CLAIMED if row["claim_is_live"] else UNCLAIMED

    @property
    def owner(self) -> str | None:
        """Return who holds a live claim on this job, or ``None``, read live."""
        row = self._read()
        if row is None or row["trashed"] or not row["claim_is_live"]:
            return None
        owner: str | None = row["claimed_by"]
        return owner

    def expires_in(self) -> float:
        """Return the seconds left on the live claim, ``-1`` if it never expires, ``-2`` if none."""
        row = self._read()
        if row is None or row["trashed"] or not row["claim_is_live"]:
            return KEY_NOT_FOUND
        if row["claim_expires_at"] is None:
            return DOES_NOT_EXPIRE
        return max(
            0.0,
            (engine.to_datetime(row["claim_expires_at"]) - engine.to_datetime(row["db_now"])).total_seconds(),
        )

    def extend_expiry(self, seconds: float) -> bool:
        """Make the live claim on this job expire ``seconds`` from now; return whether there was one.

        A claim made without an expiry gets one. Expired, abandoned and finished jobs give
        ``False``.
        """
        seconds = check_seconds(seconds, "seconds", positive=True)
        using = self._alias

        def work() -> bool:
            return bool(
                Job.objects.db_manager(using)
                .filter(_live_claim(), pk=self.pk, trashed=False)
                .update(claim_expires_at=engine.DbNow(seconds), last_modified=engine.DbNow())
            )

        return engine.run_in_transaction(Job, using, work)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until this job is COMPLETE (``True``) or ``timeout`` seconds pass (``False``)."""
        timeout = check_timeout(timeout)
        return engine.poll(lambda: self.state == COMPLETE, timeout, using=self._alias, what="job.wait()")


class ConsumedJob(models.Model):
    """A consumed job, kept for ``TASKLOOP["JOB_HISTORY_RETENTION"]`` seconds after the fact."""

    uuid = models.CharField(max_length=36, editable=False)
    board = models.ForeignKey(
        JobBoard, on_delete=models.CASCADE, related_name="consumed_jobs", db_index=False
    )
    name = models.CharField(max_length=_JOB_NAME_LENGTH)
    details = models.JSONField(default=dict, blank=True)
    priority = PriorityField(default=JobPriority.NORMAL)
    created_on = models.DateTimeField()
    consumed_by = models.CharField(max_length=_OWNER_LENGTH)
    consumed_at = models.DateTimeField()

    class Meta:
        app_label = "django_taskloop"
        db_table = "taskloop_consumed_job"
        ordering = ["-consumed_at"]
        constraints = [models.UniqueConstraint(fields=["uuid"], name="taskloop_consumed_uuid_uniq")]
        indexes = [
            models.Index(fields=["board", "consumed_at"], name="taskloop_consumed_board_idx"),
            models.Index(fields=["consumed_at"], name="taskloop_consumed_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.uuid})"

    @property
    def state(self) -> str:
        """Return ``"COMPLETE"``: a consumed job is finished."""
        return COMPLETE
