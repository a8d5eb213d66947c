"""What commands and errors say to a new user (issue 13): plain errors, no tracebacks, one wording."""

from __future__ import annotations

import io
import logging

import pytest
from django.core.management import CommandError, call_command

from django_taskloop.models import JobBoard, Tube
from django_taskloop.workers import get_handlers

pytestmark = pytest.mark.django_db


def test_only_accepts_a_loop_model_label_in_any_case():
    for spelling in ("testapp.workerloop", "testapp.WorkerLoop", "TESTAPP.WORKERLOOP"):
        (handler,) = get_handlers([spelling])
        assert handler.name == "testapp.workerloop"
    # Tube and board names stay exact: "W-DRAIN" is not "w-drain".
    with pytest.raises(ValueError, match="unknown handler"):
        get_handlers(["W-DRAIN"])


def test_reap_locks_refuses_an_unknown_database_with_a_command_error():
    with pytest.raises(CommandError, match="'nope' is not a database alias; known: default, other"):
        call_command("reap_locks", "--database", "nope")


def test_reap_locks_says_nothing_of_django_tasks_results_without_a_tasks_setting():
    from django.test import override_settings

    with override_settings(TASKS={}):
        out = io.StringIO()
        call_command("reap_locks", stdout=out)
    assert "django-tasks" not in out.getvalue()
    # With the backend configured (the test settings), the line is there.
    out = io.StringIO()
    call_command("reap_locks", stdout=out)
    assert "results django-tasks: pruned 0" in out.getvalue()


def test_board_and_tube_names_are_refused_in_one_wording():
    with pytest.raises(ValueError) as tube_error:
        Tube.objects.create_tube("bad name", "fifo")
    with pytest.raises(ValueError) as board_error:
        JobBoard.objects.create_board("bad name")
    expected = "name must be 1-100 ASCII letters, digits, '_', '-' or '.', not 'bad name'"
    assert str(tube_error.value) == str(board_error.value) == expected
    assert not Tube.objects.exists() and not JobBoard.objects.exists()


def test_a_tube_created_with_other_options_than_asked_says_so(caplog):
    # A worker's @tube("emails") created it first with the defaults; the code then asks for ttr=60.
    Tube.objects.create_tube("emails", "fifottl")
    with caplog.at_level(logging.WARNING, logger="django_taskloop.tubes"):
        tube = Tube.objects.create_tube("emails", "fifottl", if_not_exists=True, ttr=60)
    assert tube.ttr is None  # the stored tube wins
    (record,) = caplog.records
    assert "tube 'emails' already exists with ttr=None" in record.getMessage()
    assert "asked for ttr=60" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="django_taskloop.tubes"):
        Tube.objects.create_tube("emails", "fifottl", if_not_exists=True)
    assert not caplog.records  # nothing asked that differs


@pytest.fixture
def scratch_registry():
    """Handlers registered by a test leave the registry afterwards."""
    from django_taskloop.workers import registry

    before = dict(registry)
    yield
    registry.clear()
    registry.update(before)


def test_tube_decorator_takes_the_tubes_options_and_the_worker_warns_of_a_mismatch(caplog, scratch_registry):
    from django_taskloop.workers import tube
    from django_taskloop.workers.drivers import make_driver

    handler = tube("w-opts", type="fifottl", ttr=60, pri=3)(lambda task: None)
    assert handler.create == {"type": "fifottl", "ttr": 60, "pri": 3}
    make_driver(handler, "w").prepare()
    stored = Tube.objects.get(name="w-opts")
    assert (stored.type, stored.ttr, stored.pri) == ("fifottl", 60, 3)
    other = tube("w-opts-2", ttr=5)(lambda task: None)
    Tube.objects.create_tube("w-opts-2", "fifottl", ttr=30)
    with caplog.at_level(logging.WARNING, logger="django_taskloop.tubes"):
        make_driver(other, "w").prepare()
    assert "tube 'w-opts-2' already exists with ttr=30" in caplog.text
    assert "asked for ttr=5" in caplog.text
    with pytest.raises(TypeError, match="pri must be an int"):
        tube("w-opts-3", pri="high")
