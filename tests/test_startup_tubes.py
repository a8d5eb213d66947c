"""A ``@tube`` handler puts from any process (``send.put(data)``), creating its tube with the
decorator's options on first use; a tube made elsewhere with other options is a warning that
names both (README: "Running it"), for the putter and for the worker, not a refusal."""

from __future__ import annotations

import logging
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connections

from django_taskloop.models import Tube
from django_taskloop.workers import get_handlers, registry
from tests.testapp.models import WorkLog

from .workers_util import run_workers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def handlers():
    get_handlers()  # imports the test app's taskloop.py
    return registry


def test_put_creates_the_tube_with_the_decorators_options(handlers):
    assert not Tube.objects.filter(name="w-slow").exists()
    task = handlers["w-slow"].put({"sleep": 0}, pri=3)
    tube = Tube.objects.get(name="w-slow")
    assert (tube.type, tube.ttr, tube.ttl) == ("fifottl", 2, None)  # @tube("w-slow", ttr=2)
    assert task.data == {"sleep": 0} and task.pri == 3
    more = handlers["w-slow"].put_many([{"sleep": 1}, {"sleep": 2}])
    later = async_to_sync(handlers["w-slow"].aput)({"sleep": 3})
    assert [t.data["sleep"] for t in tube.tasks.order_by("id")] == [0, 1, 2, 3]
    assert {t.id for t in more} | {later.id, task.id} == set(tube.tasks.values_list("id", flat=True))


def test_put_after_the_tube_was_dropped_makes_it_again(handlers):
    handlers["w-slow"].put({"sleep": 0})
    Tube.objects.get(name="w-slow").drop()
    handlers["w-slow"].put({"sleep": 1})
    assert [t.data for t in Tube.objects.get(name="w-slow").tasks.all()] == [{"sleep": 1}]


def test_put_is_for_tube_handlers_only(handlers):
    with pytest.raises(TypeError, match="put\\(\\) is for @tube handlers; board 'w-board'"):
        handlers["w-board"].put({})
    assert not WorkLog.objects.exists()


def test_racing_first_puts_make_one_tube(handlers):
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def put(n: int) -> None:
        try:
            start.wait()
            handlers["w-noop"].put({"n": n})
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=put, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Tube.objects.filter(name="w-noop").count() == 1
    assert sorted(t.data["n"] for t in Tube.objects.get(name="w-noop").tasks.all()) == [0, 1, 2, 3]


def test_a_tube_made_with_another_type_warns_the_putter(handlers, caplog):
    Tube.objects.create_tube("w-noop", "fifo")
    with caplog.at_level(logging.WARNING, logger="django_taskloop"):
        task = handlers["w-noop"].put({"n": 1})
    assert task.tube.type == "fifo"
    assert "tube 'w-noop' exists with type 'fifo'; @tube asked for type='fifottl'" in caplog.text


@pytest.mark.slow
def test_the_worker_warns_and_serves_a_tube_made_with_other_options():
    tube = Tube.objects.create_tube("w-drain", "utube")
    ids = {str(tube.put({"n": n}).id) for n in range(3)}
    run = run_workers("--burst", "--only", "w-drain")
    assert run.returncode == 0, run.stderr
    assert "TubeError" not in run.stderr, run.stderr
    assert "tube 'w-drain' exists with type 'utube'; @tube asked for type='fifottl'" in run.stderr, run.stderr
    assert set(WorkLog.objects.filter(kind="drain").values_list("key", flat=True)) == ids
