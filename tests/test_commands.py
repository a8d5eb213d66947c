"""What commands and errors say to a new user (issue 13): plain errors, no tracebacks, one wording."""

from __future__ import annotations

import io

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
