"""Model-based tests: random sequences of operations against the real database, checked
against a small in-memory model of the seed semantics (hypothesis stateful testing).

Each machine keeps what the seed system promises (doloop, TaskFlow's job board, Tarantool's
fifo queue, Lockable's claim rule) as plain Python and checks every answer and, after every
step, the whole stored state. Leases are long (an hour) so that the database clock never
expires one behind the model's back; "time passing" is a rule that moves a deadline into the
past in the database, through the database clock.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_taskloop.engine import DbNow
from django_taskloop.exceptions import JobFailure, NotFound, NotTaken, UnclaimableJob
from django_taskloop.models import Job, JobBoard, JobPriority, Task, Tube
from tests.testapp.models import Ticket, WorkerLoop

pytestmark = pytest.mark.django_db

MACHINE = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
OWNERS = ["ann", "bob", "cy"]
STEPS: dict[str, int] = {}


def count(machine: str) -> None:
    STEPS[machine] = STEPS.get(machine, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report_steps():
    yield
    print(f"\n[reliability] stateful steps: {STEPS}")


# -- Lockable ------------------------------------------------------------------------------------


class LockableMachine(RuleBasedStateMachine):
    """Rows of ``Ticket``: owner or ``None``, and whether the lease has run out."""

    def __init__(self) -> None:
        super().__init__()
        Ticket.objects.all().delete()
        self.rows: dict[int, dict] = {}

    @rule(n=st.integers(1, 4), queue=st.sampled_from("ab"))
    def add(self, n, queue):
        count("lockable")
        for ticket in Ticket.objects.bulk_create([Ticket(queue=queue) for _ in range(n)]):
            self.rows[ticket.pk] = {"owner": None, "expired": False, "queue": queue}

    @rule(owner=st.sampled_from(OWNERS), limit=st.integers(1, 5), queue=st.sampled_from(["a", "b", None]))
    def claim(self, owner, limit, queue):
        count("lockable")
        expected = [
            pk
            for pk, row in sorted(self.rows.items())
            if (queue is None or row["queue"] == queue)
            and (row["owner"] is None or row["expired"] or row["owner"] == owner)
        ][:limit]
        queryset = Ticket.objects.all() if queue is None else Ticket.objects.filter(queue=queue)
        got = queryset.claim(owner, limit, lock_for=3600)
        assert [t.pk for t in got] == expected
        assert all(t.locked_by == owner for t in got)
        for pk in expected:
            self.rows[pk].update(owner=owner, expired=False)

    @rule(owner=st.sampled_from([*OWNERS, None]))
    def release(self, owner):
        count("lockable")
        mine = [
            pk for pk, row in self.rows.items() if row["owner"] and (owner is None or row["owner"] == owner)
        ]
        assert Ticket.objects.release(owner) == len(mine)
        for pk in mine:
            self.rows[pk].update(owner=None, expired=False)

    @precondition(lambda self: any(row["owner"] for row in self.rows.values()))
    @rule(data=st.data())
    def time_passes(self, data):
        count("lockable")
        locked = sorted(pk for pk, row in self.rows.items() if row["owner"] and not row["expired"])
        if not locked:
            return
        pk = data.draw(st.sampled_from(locked))
        Ticket.objects.filter(pk=pk).update(lock_expires_at=DbNow(-1))
        self.rows[pk]["expired"] = True

    @rule()
    def release_expired(self):
        count("lockable")
        expired = [pk for pk, row in self.rows.items() if row["owner"] and row["expired"]]
        assert Ticket.objects.release_expired() == len(expired)
        for pk in expired:
            self.rows[pk].update(owner=None, expired=False)

    @invariant()
    def stored_state_matches(self):
        stored = {t.pk: t for t in Ticket.objects.all()}
        assert set(stored) == set(self.rows)
        locked = set(Ticket.objects.locked().values_list("pk", flat=True))
        for pk, row in self.rows.items():
            assert stored[pk].locked_by == row["owner"], pk
            assert (pk in locked) == bool(row["owner"] and not row["expired"]), pk


def test_lockable_matches_its_model():
    run_state_machine_as_test(LockableMachine, settings=MACHINE)


# -- Loops (doloop) ------------------------------------------------------------------------------


class LoopMachine(RuleBasedStateMachine):
    """doloop without bumps: ids never done, locked, or done (resting for ``min_loop_time``)."""

    def __init__(self) -> None:
        super().__init__()
        WorkerLoop.objects.all().delete()
        # id -> {"done": bool, "locked": bool}
        self.ids: dict[int, dict] = {}

    ids_strategy = st.lists(st.integers(1, 12), max_size=5)

    @rule(ids=ids_strategy)
    def add(self, ids):
        count("loop")
        new = {i for i in ids if i not in self.ids}
        assert WorkerLoop.objects.add(ids) == len(new)
        for i in new:
            self.ids[i] = {"done": False, "locked": False}

    @rule(ids=ids_strategy)
    def remove(self, ids):
        count("loop")
        present = {i for i in ids if i in self.ids}
        assert WorkerLoop.objects.remove(ids) == len(present)
        for i in present:
            del self.ids[i]

    @rule(limit=st.integers(0, 5))
    def claim(self, limit):
        count("loop")
        # Never-updated ids first, by id; done ids rest for an hour; locked ones are skipped.
        expected = sorted(i for i, s in self.ids.items() if not s["done"] and not s["locked"])[:limit]
        assert WorkerLoop.objects.claim(limit, lock_for=3600, min_loop_time=3600) == expected
        for i in expected:
            self.ids[i]["locked"] = True

    @rule(ids=ids_strategy, verb=st.sampled_from(["did", "unlock"]))
    def finish(self, ids, verb):
        count("loop")
        unique = set(ids)
        # auto_add: unknown ids are added first, so the update matches every id given.
        assert getattr(WorkerLoop.objects, verb)(ids) == len(unique)
        for i in unique:
            state = self.ids.setdefault(i, {"done": False, "locked": False})
            state["locked"] = False
            if verb == "did":
                state["done"] = True

    @rule(ids=ids_strategy)
    def status(self, ids):
        count("loop")
        got = WorkerLoop.objects.status(ids)
        assert set(got) == {i for i in ids if i in self.ids}
        for i, (since_updated, locked_for) in got.items():
            assert (since_updated is not None) == self.ids[i]["done"]
            assert (locked_for is not None and locked_for > 0) == self.ids[i]["locked"]

    @invariant()
    def stored_state_matches(self):
        rows = {r.pk: r for r in WorkerLoop.objects.all()}
        assert set(rows) == set(self.ids)
        stats = WorkerLoop.objects.stats()
        assert stats["locked"] == sum(s["locked"] for s in self.ids.values())
        for i, state in self.ids.items():
            assert (rows[i].last_updated is not None) == state["done"], i
            assert (rows[i].lock_until is not None) == state["locked"], i


def test_loop_matches_doloop_model():
    run_state_machine_as_test(LoopMachine, settings=MACHINE)


# -- Job boards (TaskFlow) -----------------------------------------------------------------------


class BoardMachine(RuleBasedStateMachine):
    """Jobs: UNCLAIMED, CLAIMED by someone, or gone (consumed/trashed)."""

    def __init__(self) -> None:
        super().__init__()
        Job.objects.all().delete()
        JobBoard.objects.all().delete()
        self.board = JobBoard.objects.create_board("model")
        # uuid -> {"owner": str | None, "gone": bool, "rank": priority rank, "seq": post order}
        self.jobs: dict[str, dict] = {}
        self.seq = 0

    @rule(priority=st.sampled_from(list(JobPriority)))
    def post(self, priority):
        count("board")
        job = self.board.post(f"job{self.seq}", details={"seq": self.seq}, priority=priority)
        self.jobs[job.uuid] = {"owner": None, "gone": False, "priority": priority, "seq": self.seq}
        self.seq += 1

    def _pick(self, data):
        assert self.jobs
        return data.draw(st.sampled_from(sorted(self.jobs)))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), who=st.sampled_from(OWNERS))
    def claim(self, data, who):
        count("board")
        uuid = self._pick(data)
        job = self.jobs[uuid]
        if job["gone"]:
            with pytest.raises(NotFound):
                self.board.claim(uuid, who, expiry=3600)
        elif job["owner"] is not None:
            with pytest.raises(UnclaimableJob):
                self.board.claim(uuid, who, expiry=3600)
        else:
            self.board.claim(uuid, who, expiry=3600)
            job["owner"] = who

    @rule(who=st.sampled_from(OWNERS))
    def claim_next(self, who):
        count("board")
        free = [u for u, j in self.jobs.items() if not j["gone"] and j["owner"] is None]
        best = sorted(free, key=lambda u: (_rank(self.jobs[u]["priority"]), self.jobs[u]["seq"]))
        got = self.board.claim_next(who, expiry=3600)
        if not best:
            assert got is None
            return
        assert got is not None and got.uuid == best[0]
        self.jobs[best[0]]["owner"] = who

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), who=st.sampled_from(OWNERS), verb=st.sampled_from(["abandon", "consume", "trash"]))
    def settle(self, data, who, verb):
        count("board")
        uuid = self._pick(data)
        job = self.jobs[uuid]
        call = getattr(self.board, verb)
        if job["gone"] or job["owner"] is None:
            with pytest.raises(NotFound):
                call(uuid, who)
        elif job["owner"] != who:
            with pytest.raises(JobFailure) as raised:
                call(uuid, who)
            assert not isinstance(raised.value, UnclaimableJob)
        else:
            call(uuid, who)
            if verb == "abandon":
                job["owner"] = None
            else:
                job["gone"] = True

    @invariant()
    def stored_state_matches(self):
        live = {u: j for u, j in self.jobs.items() if not j["gone"]}
        assert self.board.job_count == len(live)
        listed = [job.uuid for job in self.board.iterjobs()]
        assert listed == sorted(live, key=lambda u: (_rank(live[u]["priority"]), live[u]["seq"]))
        for uuid, job in live.items():
            assert self.board.find_owner(uuid) == job["owner"]


_ORDER = ["VERY_HIGH", "HIGH", "NORMAL", "LOW", "VERY_LOW"]


def _rank(priority: JobPriority) -> int:
    """TaskFlow's claim order: VERY_HIGH first."""
    return _ORDER.index(priority.name)


def test_board_matches_taskflow_model():
    run_state_machine_as_test(BoardMachine, settings=MACHINE)


# -- Tubes (Tarantool fifo) ----------------------------------------------------------------------


class FifoMachine(RuleBasedStateMachine):
    """A fifo tube: tasks ready, taken by a consumer, buried; done tasks vanish."""

    def __init__(self) -> None:
        super().__init__()
        Task.objects.all().delete()
        Tube.objects.all().delete()
        self.tube = Tube.objects.create_tube("model", "fifo")
        # id -> {"state": "r"|"t"|"!", "owner": str | None}
        self.tasks: dict[int, dict] = {}

    @rule(n=st.integers(0, 100))
    def put(self, n):
        count("tube")
        task = self.tube.put({"n": n})
        assert task.state == "r"
        assert all(task.id > i for i in self.tasks)
        self.tasks[task.id] = {"state": "r", "owner": None}

    @rule(who=st.sampled_from(OWNERS))
    def take(self, who):
        count("tube")
        ready = sorted(i for i, t in self.tasks.items() if t["state"] == "r")
        got = self.tube.take(0, consumer=who)
        if not ready:
            assert got is None
            return
        assert got is not None and got.id == ready[0] and got.state == "t"
        self.tasks[got.id] = {"state": "t", "owner": who}

    def _id(self, data):
        # Mostly a known id, sometimes one that never existed.
        return data.draw(st.sampled_from([*sorted(self.tasks), 10**9]))

    @rule(data=st.data(), who=st.sampled_from(OWNERS), verb=st.sampled_from(["ack", "release"]))
    def settle(self, data, who, verb):
        count("tube")
        task_id = self._id(data)
        task = self.tasks.get(task_id)
        if task is None or task["state"] != "t" or task["owner"] != who:
            with pytest.raises(NotTaken):
                getattr(self.tube, verb)(task_id, consumer=who)
            return
        got = getattr(self.tube, verb)(task_id, consumer=who)
        if verb == "ack":
            assert got.state == "-"
            del self.tasks[task_id]
        else:
            assert got.state == "r"
            task.update(state="r", owner=None)

    @rule(data=st.data(), verb=st.sampled_from(["bury", "delete_task", "peek"]))
    def by_id(self, data, verb):
        count("tube")
        task_id = self._id(data)
        task = self.tasks.get(task_id)
        if task is None:
            with pytest.raises(NotFound):
                getattr(self.tube, verb)(task_id)
            return
        got = getattr(self.tube, verb)(task_id)
        if verb == "bury":
            assert got.state == "!"
            task.update(state="!", owner=None)
        elif verb == "delete_task":
            assert got.state == "-"
            del self.tasks[task_id]
        else:
            assert got.state == task["state"]

    @rule(n=st.integers(0, 3))
    def kick(self, n):
        count("tube")
        buried = sorted(i for i, t in self.tasks.items() if t["state"] == "!")
        assert self.tube.kick(n) == min(n, len(buried))
        for i in buried[:n]:
            self.tasks[i]["state"] = "r"

    @invariant()
    def stored_state_matches(self):
        stats = self.tube.statistics()["tasks"]
        states = [t["state"] for t in self.tasks.values()]
        assert stats["ready"] == states.count("r")
        assert stats["taken"] == states.count("t")
        assert stats["buried"] == states.count("!")
        assert stats["total"] == len(states)
        stored = dict(Task.objects.filter(tube=self.tube).values_list("id", "state"))
        assert stored == {i: t["state"] for i, t in self.tasks.items()}


def test_fifo_tube_matches_tarantool_model():
    run_state_machine_as_test(FifoMachine, settings=MACHINE)
