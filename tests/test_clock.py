"""The test clock (django_taskloop.testing.advance_clock, the engine's clock offset): time on the
database's clock passes for this process without sleeping; at offset 0 every statement is what
it is with no test clock at all."""

from __future__ import annotations

import pytest
from django.db import connection

from django_taskloop import engine
from django_taskloop.engine import DbNow, Shifted, db_now
from django_taskloop.engine import kept as kept_module
from django_taskloop.models import Tube
from django_taskloop.models.tubes import Task
from django_taskloop.testing import Clock, advance_clock, controlled_clock, reset_clock

# The opt-in pytest plugin, as a user's conftest.py would load it (for taskloop_clock).
pytest_plugins = ["django_taskloop.pytest_plugin"]

#: What DbNow() and DbNow(5) compile to on each database with the clock not moved: the
#: statements production sends.
REAL_CLOCK = {
    "postgresql": (
        ("STATEMENT_TIMESTAMP()", []),
        ("(STATEMENT_TIMESTAMP() + make_interval(secs => %s))", [5.0]),
    ),
    "mysql": (
        ("UTC_TIMESTAMP(6)", []),
        ("(UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)", [5_000_000]),
    ),
    "sqlite": (
        ("(STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')", ["+0.000 seconds"]),
        ("(STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) || '000')", ["+5.000 seconds"]),
    ),
}


def compiled(expression: DbNow) -> tuple[str, list]:
    return getattr(expression, f"as_{connection.vendor}")(None, connection)


def seconds_between(later, earlier) -> float:
    return (engine.to_datetime(later) - engine.to_datetime(earlier)).total_seconds()


def statement(queryset) -> tuple[str, tuple]:
    sql, params = queryset.query.sql_with_params()
    return sql, tuple(params)


@pytest.fixture(autouse=True)
def _real_clock_after():
    yield
    reset_clock()


# -- offset 0: the statements of production ---------------------------------------------------


def test_offset_0_compiles_the_real_clock_as_before():
    assert engine.clock_offset() == 0.0
    assert (compiled(DbNow()), compiled(DbNow(5))) == REAL_CLOCK[connection.vendor]


@pytest.mark.django_db
def test_after_a_reset_every_statement_is_the_same_again():
    rows = Task.objects.filter(event_at__lte=DbNow(), ttl_at__gt=Shifted(3)).values("pk")
    before = statement(rows)
    advance_clock(100)
    assert statement(rows) != before  # the moved clock is in the statement
    reset_clock()
    assert statement(rows) == before
    assert (compiled(DbNow()), compiled(DbNow(5))) == REAL_CLOCK[connection.vendor]


def test_the_offset_is_added_to_the_expression_s_own_seconds():
    advance_clock(30)
    assert DbNow(5).total == 35.0 and DbNow().total == 30.0 and DbNow(-40).total == -10.0
    sql, params = compiled(DbNow())
    assert sql == REAL_CLOCK[connection.vendor][1][0]  # the form with an offset
    moved = {"postgresql": [30.0], "mysql": [30_000_000], "sqlite": ["+30.000 seconds"]}
    assert params == moved[connection.vendor]


# -- the clock moves --------------------------------------------------------------------------


@pytest.mark.django_db
def test_db_now_follows_the_clock():
    real = db_now()
    advance_clock(3600)
    moved = db_now()
    assert 3599 < seconds_between(moved, real) < 3630
    reset_clock()
    assert -1 < seconds_between(db_now(), real) < 30


@pytest.mark.django_db
def test_a_delayed_task_is_ready_past_its_delay_and_not_before():
    tube = Tube.objects.create_tube("clocked", "fifottl")
    task = tube.put("x", delay=60)
    assert task.state == "~"
    advance_clock(30)
    assert tube.take() is None
    assert tube.peek(task.pk).state == "~"
    advance_clock(31)
    assert tube.peek(task.pk).state == "r"
    assert tube.take().pk == task.pk


@pytest.mark.django_db
def test_a_kept_statement_built_before_an_advance_sees_the_new_time():
    tube = Tube.objects.create_tube("kept", "fifottl", ttr=10)
    first = tube.put("a")
    real = db_now()
    taken = tube.take(consumer="me")  # compiles the take's claim, kept from now on
    assert taken.pk == first.pk and 9 < seconds_between(taken.event_at, real) < 40
    assert kept_module._kept  # the claim (among others) is kept
    advance_clock(1000)
    assert not kept_module._kept  # nothing keeps the clock as it was
    # The first task's ttr ran out on the moved clock; a take claims it with a ttr from then.
    again = tube.take(consumer="me")
    assert again.pk == first.pk
    assert 1009 < seconds_between(again.event_at, real) < 1040


@pytest.mark.django_db
def test_a_kept_insert_built_before_an_advance_writes_the_new_time():
    tube = Tube.objects.create_tube("puts", "fifottl")
    before = tube.put("a", ttl=60)  # compiles the put's one-row insert, kept from now on
    advance_clock(500)
    after = tube.put("b", ttl=60)
    assert 499 < seconds_between(after.ttl_at, before.ttl_at) < 530


# -- the helpers --------------------------------------------------------------------------------


def test_advances_add_up_and_a_reset_undoes_them():
    assert advance_clock(10) == 10.0
    assert advance_clock(2.5) == 12.5
    assert engine.clock_offset() == 12.5
    reset_clock()
    assert engine.clock_offset() == 0.0


@pytest.mark.parametrize("seconds", [0, -1, float("nan")])
def test_the_clock_moves_only_forward(seconds):
    with pytest.raises(ValueError, match="more than 0"):
        advance_clock(seconds)
    assert engine.clock_offset() == 0.0


@pytest.mark.parametrize("seconds", ["5", None, True])
def test_the_clock_moves_by_a_number(seconds):
    with pytest.raises(TypeError, match="a number"):
        advance_clock(seconds)


def test_controlled_clock_resets_however_its_block_ends():
    with pytest.raises(RuntimeError), controlled_clock() as clock:
        assert clock.advance(60) == 60.0 and clock.offset == 60.0
        raise RuntimeError
    assert engine.clock_offset() == 0.0


def test_the_plugin_s_fixture_moves_the_clock(taskloop_clock):
    assert isinstance(taskloop_clock, Clock)
    taskloop_clock.advance(5)
    assert engine.clock_offset() == 5.0
    taskloop_clock.reset()
    assert taskloop_clock.offset == 0.0


def test_the_suite_s_fixture_moves_the_clock(clock):
    clock.advance(7)
    assert engine.clock_offset() == 7.0
